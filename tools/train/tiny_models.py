"""The tiny chat models: configs, the MTP (nextn) head, and checkpoint save/load.

Trunks are HF transformers' own Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM. The MTP head is a small
module of ours, laid out like the real Qwen3.5 checkpoints' `mtp.*` tensors, which llama.cpp's
converter maps (conversion/qwen.py, _QwenMtpMixin):
  mtp.pre_fc_norm_embedding  -> blk.N.nextn.enorm        mtp.fc     -> blk.N.nextn.eh_proj
  mtp.pre_fc_norm_hidden     -> blk.N.nextn.hnorm        mtp.norm   -> blk.N.nextn.shared_head_norm
  mtp.layers.0.*             -> blk.N.* (a full-attention decoder layer of the trunk's kind)
with N = num_hidden_layers. For position p it reads the trunk's hidden state at p after the final
norm and the embedding of token p+1, x = fc([enorm(emb); hnorm(h)]) (embedding in the low half),
runs one full-attention decoder layer over the sequence (its own causal attention), applies its
norm and the trunk's head, and predicts token p+2 (llama.cpp src/models/qwen35.cpp, graph_mtp).
Norm weights follow the trunk's Qwen3.5 convention (scale = 1 + weight; the converter adds 1).

Works with transformers 5.17 (the GPU machine) and 5.24 (tools/requirements-fixtures.txt).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

HIDDEN = 256


def common_config(vocab_rows: int, eos_id: int, pad_id: int) -> dict:
    return dict(
        vocab_size=vocab_rows, hidden_size=HIDDEN, num_hidden_layers=8, full_attention_interval=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096,
        # rope over 16 of 64 dims; the sections must sum to rope dims / 2 = 8 (qwenrt checks it)
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [3, 3, 2], "mrope_interleaved": True},
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id, attention_bias=False, hidden_act="silu",
    )


def model_config(kind: str, vocab_rows: int, eos_id: int, pad_id: int) -> dict:
    c = common_config(vocab_rows, eos_id, pad_id)
    if kind == "dense":
        return c | dict(intermediate_size=256, tie_word_embeddings=False)
    if kind == "moe":
        return c | dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                        shared_expert_intermediate_size=256, tie_word_embeddings=True,
                        output_router_logits=False, router_aux_loss_coef=0.0)
    raise KeyError(kind)


def classes(moe: bool):
    if moe:
        from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (Qwen3_5MoeDecoderLayer,
                                                                          Qwen3_5MoeRMSNorm)
        return Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM, Qwen3_5MoeDecoderLayer, Qwen3_5MoeRMSNorm
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm
    return Qwen3_5TextConfig, Qwen3_5ForCausalLM, Qwen3_5DecoderLayer, Qwen3_5RMSNorm


class MTPHead(nn.Module):
    """One nextn block; parameter names are the checkpoint's `mtp.` names without the prefix."""

    def __init__(self, config, moe: bool):
        super().__init__()
        _, _, layer_cls, norm_cls = classes(moe)
        h, eps = config.hidden_size, config.rms_norm_eps
        mcfg = copy.deepcopy(config)
        mcfg.layer_types = ["full_attention"]
        mcfg.num_hidden_layers = 1
        self.pre_fc_norm_embedding = norm_cls(h, eps=eps)
        self.pre_fc_norm_hidden = norm_cls(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.layers = nn.ModuleList([layer_cls(mcfg, 0)])
        self.norm = norm_cls(h, eps=eps)

    def forward(self, emb_next: torch.Tensor, hidden: torch.Tensor, position_embeddings) -> torch.Tensor:
        """emb_next [B,T,H]: embeddings of tokens p+1; hidden [B,T,H]: trunk output (after its norm) at p.
        Returns the normed MTP hidden state [B,T,H]; the trunk's lm_head turns it into logits for p+2."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb_next), self.pre_fc_norm_hidden(hidden)], dim=-1))
        out = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=None)
        if isinstance(out, tuple):
            out = out[0]
        return self.norm(out)


def position_embeddings(model, x: torch.Tensor, offset: int = 0):
    b, t = x.shape[:2]
    pos = torch.arange(offset, offset + t, device=x.device)[None, None, :].expand(3, b, t)
    return model.model.rotary_emb(x, pos)


def build(kind: str, vocab_rows: int, eos_id: int, pad_id: int, seed: int):
    cfg_cls, model_cls, _, _ = classes(kind == "moe")
    torch.manual_seed(seed)
    config = cfg_cls(**model_config(kind, vocab_rows, eos_id, pad_id))
    model = model_cls(config)
    mtp = MTPHead(model.config, kind == "moe")
    mtp.apply(model._init_weights)
    return model, mtp


def param_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def mtp_checkpoint_tensors(mtp: MTPHead, dtype) -> dict[str, torch.Tensor]:
    """mtp.* tensors in the per-expert layout HF writes for trunk experts (and the real checkpoints use)."""
    out = {}
    for name, t in mtp.state_dict().items():
        t = t.detach().to("cpu", dtype).contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):       # [E, 2I, H]: gate rows first, then up
            base = name.removesuffix("gate_up_proj")
            n_ff = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"mtp.{base}{e}.gate_proj.weight"] = t[e, :n_ff].contiguous()
                out[f"mtp.{base}{e}.up_proj.weight"] = t[e, n_ff:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):         # [E, H, I]
            base = name.removesuffix("down_proj")
            for e in range(t.shape[0]):
                out[f"mtp.{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[f"mtp.{name}"] = t
    return out


def save(model, mtp: MTPHead, out_dir: Path, dtype=torch.float16) -> None:
    """HF directory: the trunk as transformers saves it, plus the mtp.* tensors in model.safetensors."""
    from safetensors.torch import load_file, save_file
    out_dir.mkdir(parents=True, exist_ok=True)
    model = model.to(dtype)
    model.config.dtype = str(dtype).removeprefix("torch.")
    model.save_pretrained(out_dir)
    model.float()
    st = out_dir / "model.safetensors"
    tensors = load_file(str(st))
    tensors.update(mtp_checkpoint_tensors(mtp, dtype))
    save_file(tensors, str(st), metadata={"format": "pt"})
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["mtp_num_hidden_layers"] = 1          # as the real Qwen3.5 configs say; the converter reads it
    cfg["mtp_use_dedicated_embeddings"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def load(hf_dir: Path, moe: bool, dtype=torch.float32):
    """(trunk, mtp) from a directory written by save()."""
    from safetensors.torch import load_file
    _, model_cls, _, _ = classes(moe)
    model = model_cls.from_pretrained(str(hf_dir), dtype=dtype).eval()
    mtp = MTPHead(model.config, moe).to(dtype).eval()
    raw = {k.removeprefix("mtp."): v for k, v in load_file(str(hf_dir / "model.safetensors")).items()
           if k.startswith("mtp.")}
    sd = {}
    for name in mtp.state_dict():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name.removesuffix("gate_up_proj")
            n = mtp.state_dict()[name].shape[0]
            sd[name] = torch.stack([torch.cat([raw[f"{base}{e}.gate_proj.weight"], raw[f"{base}{e}.up_proj.weight"]])
                                    for e in range(n)])
        elif name.endswith("mlp.experts.down_proj"):
            base = name.removesuffix("down_proj")
            n = mtp.state_dict()[name].shape[0]
            sd[name] = torch.stack([raw[f"{base}{e}.down_proj.weight"] for e in range(n)])
        else:
            sd[name] = raw[name]
    mtp.load_state_dict({k: v.to(dtype) for k, v in sd.items()})
    return model, mtp
