#!/usr/bin/env python3
"""Train one tiny chat model (trunk + MTP head, jointly) on the packed windows of make_data.py.

    python tools/train/train.py --model dense --data build-train-data --out OUT/dense \
        --steps 3000 --time-limit 420
    python tools/train/train.py --model dense --data build-train-copy --out OUT2/dense \
        --init OUT/dense/hf --lr 1e-3 --warmup 50 --time-limit 420      # second stage

Loss = CE(next token) + MTP_WEIGHT * CE(token after next, from the MTP head)
       [+ AUX_WEIGHT * router load-balancing loss for the MoE model].
The learning-rate schedule follows progress = max(step / steps, elapsed / time_limit): linear
warm-up, then cosine decay to 10%; training stops at progress 1, so a slower machine still ends
on a finished schedule. bf16 autocast on CUDA, fp32 master weights, AdamW. Writes OUT/hf (the HF
checkpoint in float16 with the mtp.* tensors), OUT/loss.csv and OUT/summary.json.
"""
import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import tiny_models  # noqa: E402

MTP_WEIGHT = 0.3
AUX_WEIGHT = 0.01
SEED = 20261202


def router_hooks(modules):
    """Collect router logits [N, E] from every MoE gate during a forward."""
    store = []

    def hook(_m, _inp, out):
        store.append(out[0] if isinstance(out, tuple) else out)
    handles = [m.register_forward_hook(hook) for m in modules]
    return store, handles


def balance_loss(router_logits: list[torch.Tensor], top_k: int) -> torch.Tensor:
    """Switch-style load balancing: E * sum_e (fraction of top-k slots routed to e) * (mean prob of e)."""
    total = 0.0
    for logits in router_logits:
        probs = logits.float().softmax(-1)
        e = probs.shape[-1]
        top = probs.topk(top_k, dim=-1).indices
        frac = F.one_hot(top, e).float().sum(1).mean(0) / top_k
        total = total + e * (frac * probs.mean(0)).sum()
    return total / max(len(router_logits), 1)


def lr_at(progress: float, step: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["dense", "moe"], required=True)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--time-limit", type=float, default=420.0, help="seconds of training (schedule ends there)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--init", type=Path, help="start from this checkpoint (an OUT/hf folder) instead of random "
                    "weights; the optimizer state starts fresh")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    import transformers
    transformers.logging.set_verbosity_error()

    manifest = json.loads((args.data / "manifest.json").read_text())
    windows = np.load(args.data / "train.npz")["windows"]
    sentinel, pad_id = manifest["pad_sentinel"], manifest["pad_id"]
    data = torch.from_numpy(windows.astype(np.int64)).to(dev)
    n_win, seq_len = data.shape

    if args.init:
        model, mtp = tiny_models.load(args.init, args.model == "moe")
    else:
        model, mtp = tiny_models.build(args.model, manifest["vocab_rows"], manifest["eos_id"], pad_id, SEED)
    model.to(dev).train()
    mtp.to(dev).train()
    moe = args.model == "moe"
    top_k = model.config.num_experts_per_tok if moe else 0
    gates = [m for n, m in list(model.named_modules()) + list(mtp.named_modules()) if n.endswith("mlp.gate")]

    params = [p for p in list(model.parameters()) + list(mtp.parameters())]
    seen, uniq = set(), []
    for p in params:                      # tied embeddings appear twice
        if id(p) not in seen:
            seen.add(id(p))
            uniq.append(p)
    embed = model.model.embed_tokens.weight
    decay = [p for p in uniq if p.ndim >= 2 and p is not embed]
    no_decay = [p for p in uniq if not (p.ndim >= 2 and p is not embed)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    n_params = tiny_models.param_count(model)
    n_mtp = tiny_models.param_count(mtp)
    print(f"{args.model}: trunk {n_params} params, mtp {n_mtp}; {n_win} windows x {seq_len}; "
          f"layer_types {model.config.layer_types}; attn {model.config._attn_implementation}", flush=True)

    gen = torch.Generator(device=dev)
    gen.manual_seed(SEED)
    log_f = open(args.out / "loss.csv", "w", newline="")
    log = csv.writer(log_f)
    log.writerow(["step", "tokens", "seconds", "lr", "loss", "loss_mtp", "aux", "grad_norm"])
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")

    t0 = time.time()
    step, tokens = 0, 0
    acc = {"loss": 0.0, "mtp": 0.0, "aux": 0.0, "n": 0}
    while True:
        elapsed = time.time() - t0
        progress = max(step / args.steps, elapsed / args.time_limit)
        if progress >= 1.0:
            break
        lr = lr_at(progress, step, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, n_win, (args.batch,), device=dev, generator=gen)
        batch = data[idx]
        valid = batch != sentinel
        ids = torch.where(valid, batch, torch.full_like(batch, pad_id))
        tgt = torch.where(valid, batch, torch.full_like(batch, -100))
        if gates:
            store, handles = router_hooks(gates)
        with amp:
            hidden = model.model(input_ids=ids).last_hidden_state            # [B,T,H], after the final norm
            logits = model.lm_head(hidden[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))
            emb_next = model.model.embed_tokens(ids[:, 1:])
            pe = tiny_models.position_embeddings(model, emb_next)
            h_mtp = mtp(emb_next, hidden[:, :-1], pe)[:, :-1]
            logits_mtp = model.lm_head(h_mtp)
            loss_mtp = F.cross_entropy(logits_mtp.float().reshape(-1, logits_mtp.shape[-1]), tgt[:, 2:].reshape(-1))
            total = loss + MTP_WEIGHT * loss_mtp
            aux = torch.zeros((), device=dev)
            if gates:
                aux = balance_loss(store, top_k)
                total = total + AUX_WEIGHT * aux
        if gates:
            for h in handles:
                h.remove()
        opt.zero_grad(set_to_none=True)
        total.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(uniq, 1.0)
        opt.step()
        step += 1
        tokens += int(valid.sum())
        acc["loss"] += float(loss)
        acc["mtp"] += float(loss_mtp)
        acc["aux"] += float(aux)
        acc["n"] += 1
        if step % args.log_every == 0 or step == 1:
            n = acc["n"]
            row = [step, tokens, round(time.time() - t0, 2), f"{lr:.3e}", f"{acc['loss'] / n:.4f}",
                   f"{acc['mtp'] / n:.4f}", f"{acc['aux'] / n:.4f}", f"{float(gnorm):.3f}"]
            log.writerow(row)
            log_f.flush()
            print(" ".join(str(x) for x in row), flush=True)
            acc = {"loss": 0.0, "mtp": 0.0, "aux": 0.0, "n": 0}
    log_f.close()
    wall = time.time() - t0
    summary = {"model": args.model, "trunk_params": n_params, "mtp_params": n_mtp, "steps": step,
               "tokens": tokens, "seconds": round(wall, 1), "tokens_per_second": round(tokens / wall),
               "batch": args.batch, "seq_len": seq_len, "init": str(args.init) if args.init else None,
               "data_mix": manifest.get("mix", "base"), "peak_lr": args.lr, "warmup": args.warmup,
               "mtp_weight": MTP_WEIGHT, "aux_weight": AUX_WEIGHT if moe else 0.0, "seed": SEED,
               "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
               "torch": torch.__version__, "transformers": transformers.__version__,
               "config": tiny_models.model_config(args.model, manifest["vocab_rows"], manifest["eos_id"], pad_id)}
    print(json.dumps(summary), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if not args.no_save:
        model.eval()
        tiny_models.save(model, mtp, args.out / "hf")
        for f in (args.data / "tokenizer").iterdir():
            (args.out / "hf" / f.name).write_bytes(f.read_bytes())


if __name__ == "__main__":
    main()
