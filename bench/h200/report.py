#!/usr/bin/env python3
"""The H200 side by side (bench/h200/run.sh): weight bytes per token, result collection, report.

Standard library only, so it runs on the H200 (its python3 has no `gguf`) and here alike:

  report.py tensors INFO_JSON|-          `qwenrt info FILE --json` -> the compact tensor table and
                                         weight bytes per decoded token (JSON on stdout)
  report.py collect WORK_DIR             run.sh's raw folder -> one results JSON on stdout
  report.py render RESULTS_JSON [--out FILE] [--bandwidth B/s]
                                         the bench/results-style markdown
  report.py weights --gguf FILE          the same weight figure from a GGUF through the PyPI gguf
                                         package (run with .venv/bin/python; a cross-check)

Weight bytes per decoded token (the same definition as bench/cpu_compare.py): every tensor a token
reads; for MoE only expert_used_count / expert_count of each `*_exps` tensor; one row of
token_embd (all of it when it doubles as the output matrix); MTP blocks excluded. KV cache and
recurrent state are not counted. Roofline: bandwidth / that figure (default 4.27e12 B/s, the
H200's measured device-to-device copy rate, shared/NOTES-gpu.md).
"""
import argparse
import json
import re
import statistics
import sys
from pathlib import Path

DEFAULT_BANDWIDTH = 4.27e12


# --- weight bytes per token ---------------------------------------------------------------------

def weight_bytes(metadata: dict, tensors: list) -> dict:
    """metadata: key -> scalar value; tensors: [{"name", "shape", "n_bytes"}, ...]."""
    arch = metadata.get("general.architecture")
    n_expert = int(metadata.get(f"{arch}.expert_count", 0) or 0)
    n_used = int(metadata.get(f"{arch}.expert_used_count", 0) or 0)
    n_block = int(metadata.get(f"{arch}.block_count", 0) or 0)
    n_mtp = int(metadata.get(f"{arch}.nextn_predict_layers", 0) or 0)
    names = {t["name"] for t in tensors}
    tied = "output.weight" not in names
    total = per_token = experts_all = experts_used = 0
    for t in tensors:
        n = int(t["n_bytes"])
        total += n
        m = re.match(r"blk\.(\d+)\.", t["name"])
        if t["name"].startswith("nextn.") or (m and n_mtp and int(m.group(1)) >= n_block - n_mtp):
            continue  # MTP block: not read by plain decode
        if "_exps" in t["name"] and n_expert:
            experts_all += n
            experts_used += n * n_used / n_expert
            per_token += n * n_used / n_expert
        elif t["name"] == "token_embd.weight" and not tied:
            rows = 1
            for d in list(t["shape"])[1:]:
                rows *= int(d)
            per_token += n / max(rows, 1)
        else:
            per_token += n
    return {"arch": arch, "tensor_bytes": total, "per_token": per_token,
            "experts": [n_used, n_expert], "expert_bytes": experts_all,
            "expert_bytes_used": experts_used}


def from_info_json(info: dict) -> dict:
    meta = {}
    for kv in info.get("metadata", []):
        v = kv.get("value")
        if isinstance(v, (int, float, str, bool)):
            meta[kv["key"]] = v
    tensors = [{"name": t["name"], "type": t.get("type"), "shape": t["shape"],
                "n_bytes": t["n_bytes"]} for t in info.get("tensors", [])]
    keep = {k: v for k, v in meta.items()
            if k.startswith("general.") or k.split(".", 1)[-1] in (
                "expert_count", "expert_used_count", "block_count", "nextn_predict_layers",
                "embedding_length", "context_length", "full_attention_interval")}
    return {"metadata": keep, "weights": weight_bytes(meta, tensors), "tensors": tensors}


def cmd_tensors(args) -> None:
    src = sys.stdin if args.info == "-" else open(args.info, encoding="utf-8", errors="replace")
    with src:
        info = json.load(src)
    json.dump(from_info_json(info), sys.stdout, indent=1)
    sys.stdout.write("\n")


def cmd_weights(args) -> None:
    import gguf  # the PyPI package (.venv)
    r = gguf.GGUFReader(args.gguf)
    meta = {}
    for key, f in r.fields.items():
        try:
            v = f.contents()
        except Exception:  # noqa: BLE001 - some field kinds have no simple contents
            continue
        if isinstance(v, (int, float, str, bool)):
            meta[key] = v
    tensors = [{"name": t.name, "shape": [int(d) for d in t.shape], "n_bytes": int(t.n_bytes)}
               for t in r.tensors]
    json.dump(weight_bytes(meta, tensors), sys.stdout, indent=1)
    sys.stdout.write("\n")


# --- collect --------------------------------------------------------------------------------------

def read_text(p: Path):
    try:
        return p.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def parse_json_output(text):
    """A JSON document, or JSON lines (llama-batched-bench -o jsonl), or None."""
    if not text or not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    # JSON after log lines: from the first line that opens an object or array.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("{", "[")):
            try:
                return json.loads("\n".join(lines[i:]))
            except ValueError:
                break
    rows = []
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows or None


def read_mem(p: Path):
    text = read_text(p)
    if text is None:
        return None
    vals = []
    for line in text.split():
        try:
            vals.append(int(float(line.strip().rstrip(","))))
        except ValueError:
            pass
    return vals


def collect_run(d: Path, stem: str) -> dict:
    run = {"cmd": (read_text(d / f"{stem}.cmd") or "").strip()}
    t = (read_text(d / f"{stem}.time") or "").split()
    if len(t) >= 2:
        run["wall_s"] = float(t[1]) - float(t[0])
    rc = (read_text(d / f"{stem}.rc") or "").strip()
    run["rc"] = int(rc) if rc.lstrip("-").isdigit() else None
    run["output"] = parse_json_output(read_text(d / f"{stem}.out"))
    err = read_text(d / f"{stem}.err")
    if err:
        run["stderr_tail"] = err[-2000:]
    note = (read_text(d / f"{stem}.note") or "").strip()
    if note:
        run["note"] = note
    mem = read_mem(d / f"{stem}.mem")
    base = read_mem(d / f"{stem}.mem0")
    if mem:
        run["gpu_mem_mib"] = {"peak": max(mem), "samples": len(mem),
                              "baseline": (min(base) if base else None)}
    return run


def cmd_collect(args) -> None:
    work = Path(args.work)
    meta = json.loads(read_text(work / "meta.json") or "{}")
    for k in ("nvidia_smi", "build_log_tail", "qwenrt_ldd"):
        v = read_text(work / f"{k}.txt")
        if v is not None:
            meta[k] = v[-4000:]
    b = (read_text(work / "llamacpp-build.time") or "").split()
    if len(b) >= 2:
        meta["llamacpp_build_s"] = float(b[1]) - float(b[0])
    rc = (read_text(work / "llamacpp-build.rc") or "").strip()
    if rc:
        meta["llamacpp_build_rc"] = int(rc)
    files = []
    for d in sorted(p for p in (work / "files").glob("*") if p.is_dir()):
        f = json.loads(read_text(d / "file.json") or "{}")
        f["tag"] = d.name
        tens = read_text(d / "tensors.json")
        if tens:
            t = json.loads(tens)
            f["weights"] = t.get("weights")
            f["gguf_metadata"] = t.get("metadata")
        synth = (read_text(d / "synth.log") or "").strip()
        if synth:
            f["synth_log"] = synth[-1000:]
        stems = sorted({p.name.rsplit(".", 1)[0] for p in d.glob("*.cmd")})
        f["runs"] = {s: collect_run(d, s) for s in stems}
        files.append(f)
    order = meta.get("files") or []
    files.sort(key=lambda f: order.index(f["tag"]) if f["tag"] in order else len(order))
    res = {"schema": "qwenrt-h200-bench/1", "meta": meta, "files": files}
    kd = work / "kld"
    if kd.is_dir():  # run.sh --kld: tools/kld/run.sh's summary and how the run went
        kld = {"cmd": (read_text(kd / "cmd.txt") or "").strip()}
        t = (read_text(kd / "time.txt") or "").split()
        if len(t) >= 2:
            kld["wall_s"] = float(t[1]) - float(t[0])
        rc = (read_text(kd / "rc.txt") or "").strip()
        kld["rc"] = int(rc) if rc.lstrip("-").isdigit() else None
        summary = read_text(kd / "kld-summary.json")
        if summary:
            try:
                kld["summary"] = json.loads(summary)
            except ValueError:
                pass
        kld["summary_md"] = read_text(kd / "kld-summary.md")
        log = read_text(kd / "run.log")
        if log:
            kld["log_tail"] = log[-2000:]
        res["kld"] = kld
    json.dump(res, sys.stdout, indent=1)
    sys.stdout.write("\n")


# --- render ---------------------------------------------------------------------------------------

def median(v):
    return statistics.median(v) if v else float("nan")


def qwenrt_figures(run) -> dict:
    """test name -> {"median", "samples"} (tok/s) from `qwenrt bench --json`; "tg128 @ d512" when
    the run had -d 512 (qwenrt names it so itself; older JSON had no depth)."""
    out = {}
    j = (run or {}).get("output")
    if not isinstance(j, dict):
        return out
    depth = int(j.get("depth") or 0)
    for r in j.get("results", []):
        samples = [r["tokens"] / s for s in r.get("seconds", []) if s > 0]
        name = r["test"]
        if depth and name.startswith("tg") and "@" not in name:
            name = name.replace(" x", f" @ d{depth} x") if " x" in name else f"{name} @ d{depth}"
        out[name] = {"median": median(samples), "samples": samples}
    return out


def qwenrt_load(run):
    j = (run or {}).get("output")
    return j.get("load_seconds") if isinstance(j, dict) else None


def llama_test_name(e: dict) -> str:
    p, n, d = int(e.get("n_prompt", 0)), int(e.get("n_gen", 0)), int(e.get("n_depth", 0) or 0)
    name = f"pp{p}+tg{n}" if p and n else (f"pp{p}" if p else f"tg{n}")
    return name + (f" @ d{d}" if d else "")


def llama_figures(run) -> dict:
    out = {}
    j = (run or {}).get("output")
    if not isinstance(j, list):
        return out
    for e in j:
        if not isinstance(e, dict) or "n_gen" not in e:
            continue
        samples = list(e.get("samples_ts") or [])
        if not samples and e.get("samples_ns"):
            tok = int(e.get("n_prompt", 0)) + int(e.get("n_gen", 0))
            samples = [tok / (ns / 1e9) for ns in e["samples_ns"] if ns]
        out[llama_test_name(e)] = {"median": median(samples), "samples": samples,
                                   "avg": e.get("avg_ts")}
    return out


def fmt(x, nd=1):
    if x is None or x != x:  # None or NaN
        return "-"
    return f"{x:,.{nd}f}"


def mem_str(run):
    m = (run or {}).get("gpu_mem_mib")
    if not m:
        return "-"
    if m.get("baseline") is not None:
        return f"{m['peak']:,} ({m['peak'] - m['baseline']:,} over idle)"
    return f"{m['peak']:,}"


def ok(run):
    return run is not None and run.get("rc") == 0


def shown_cmd(cmd: str) -> str:
    return cmd.replace("|", "\\|")


def pick(runs: dict, stem: str):
    """The quiet run STEM, else STEM-during-build; (run, marked) or (None, False)."""
    if ok(runs.get(stem)):
        return runs[stem], False
    if ok(runs.get(stem + "-during-build")):
        return runs[stem + "-during-build"], True
    return None, False


def ratio(a, b):
    return a / b if a and b else None


def pct(x, roof):
    return fmt(100 * x / roof) + "%" if x and roof else "-"


def render(res: dict, bandwidth: float) -> str:
    meta = res.get("meta", {})
    files = res.get("files", [])
    depth = int(meta.get("depth", 512) or 0)
    gpu = (meta.get("gpu") or "").strip()
    # The lent machines are H200s and, when none is lent, H100s.
    card = "H100" if "H100" in gpu else "H200"
    lines = [f"# {card}: qwenrt vs llama.cpp, decode on full-size synthetic files", ""]
    if meta.get("command"):
        lines += [f"Command (on the {card}, repository root): `{meta['command']}`", ""]
    lines.append(f"- Date: {meta.get('started', '?')} to {meta.get('finished', '?')} (UTC).")
    if gpu:
        lines.append(f"- GPU: {gpu}.")
    if meta.get("git"):
        lines.append(f"- qwenrt: {meta['git']}.")
    lb = None
    for f in files:
        out = (f.get("runs", {}).get("llamacpp") or {}).get("output")
        if isinstance(out, list) and out and isinstance(out[0], dict):
            lb = out[0]
            break
    if lb:
        lines.append(f"- llama.cpp: the vendored source of llama-cpp-python 0.3.36 "
                     f"(bench/pack_llamacpp_src.sh), built in the run: backends "
                     f"{lb.get('backends', '?')}, {lb.get('gpu_info') or 'no GPU'}; llama-bench "
                     f"build {lb.get('build_number', '?')}, commit {lb.get('build_commit', '?')}.")
    if "llamacpp_build_s" in meta:
        lines.append(f"- llama.cpp build: {meta['llamacpp_build_s']:.0f} s, exit status "
                     f"{meta.get('llamacpp_build_rc', '?')}.")
    elif meta.get("llamacpp") == "off":
        lines.append("- llama.cpp: not run (--no-llamacpp).")
    if files:
        lines.append(f"- Roofline: weight bytes read per decoded token / {bandwidth / 1e12:.2f} TB/s "
                     "(every non-expert tensor, `expert_used_count / expert_count` of the "
                     "routed-expert tensors, one row of token_embd; KV cache and recurrent state "
                     "not counted).")
        lines.append("- tok/s are medians of the repeats. qwenrt `tgN`: N decode steps at batch 1 "
                     "after 4 untimed ones, each ending in on-device greedy sampling (as generation "
                     "runs them), from an empty context; `tgN @ dD`: the same after an untimed "
                     "D-token prompt (`qwenrt bench -d D`, a separate process). llama.cpp `tgN` "
                     "starts from an empty context after its warm-up run, `tgN @ dD` after an "
                     "untimed prefill of D tokens (`llama-bench -d`). Each ratio compares like "
                     "with like; the headline is decode after a "
                     f"{depth}-token prompt." if depth else
                     "- tok/s are medians of the repeats (no depth run).")
        lines.append("- Load time: qwenrt's is the `load_seconds` its bench JSON reports (the "
                     "engine load it times itself: the file from the page cache, the upload); "
                     "llama.cpp's is the wall time of a separate `llama-bench -p 1 -n 0 -r 1 "
                     "--no-warmup` process (start to exit: it also counts CUDA initialisation, "
                     "one one-token step and the exit), so it is an upper bound. GPU memory: the "
                     "peak of `nvidia-smi --query-gpu=memory.used` sampled during the benchmark "
                     "process.")
    if meta.get("notes"):
        for n in meta["notes"]:
            lines.append(f"- {n}")
    head = ["file", "read / token", "roofline tok/s"]
    if depth:
        head += [f"qwenrt tg @ d{depth}", f"llama.cpp tg @ d{depth}",
                 f"qwenrt / llama.cpp @ d{depth}"]
    head += ["qwenrt tg", "llama.cpp tg", "qwenrt / llama.cpp", "qwenrt % roofline",
             "llama.cpp % roofline"]
    table1 = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    table2 = []
    pp_names = []
    details = []
    headline = []
    marked_any = False
    for f in files:
        runs = f.get("runs", {})
        w = f.get("weights") or {}
        bpt = w.get("per_token")
        roof = bandwidth / bpt if bpt else None
        q0_run, m0 = pick(runs, "qwenrt")
        qd_run, md = pick(runs, f"qwenrt-d{depth}") if depth else (None, False)
        q0, qd = qwenrt_figures(q0_run), qwenrt_figures(qd_run)
        lr = runs.get("llamacpp")
        lf = llama_figures(lr) if ok(lr) else {}
        tg = next((k for k in q0 if k.startswith("tg") and " x" not in k and "@" not in k), None)
        tg = tg or next((k for k in lf if k.startswith("tg") and "@" not in k), "tg128")
        tgd = f"{tg} @ d{depth}"
        pp = next((k for k in q0 if k.startswith("pp") and "@" not in k), None)
        pp = pp or next((k for k in lf if k.startswith("pp") and "@" not in k), "pp512")
        qv, lv = q0.get(tg, {}).get("median"), lf.get(tg, {}).get("median")
        qdv, ldv = qd.get(tgd, {}).get("median"), lf.get(tgd, {}).get("median")
        qpp, lpp = q0.get(pp, {}).get("median"), lf.get(pp, {}).get("median")
        ql = qwenrt_load(runs.get("qwenrt")) if ok(runs.get("qwenrt")) else None
        if ql is None:
            ql = qwenrt_load(q0_run) or qwenrt_load(qd_run)
        ll = (runs.get("llamacpp-load") or {}).get("wall_s") if ok(runs.get("llamacpp-load")) else None
        name = f.get("name") or f["tag"]
        s0, sd = (" (*)" if m0 else ""), (" (*)" if md else "")
        marked_any = marked_any or (m0 and q0_run) or (md and qd_run)
        row = [name, f"{fmt(bpt / 1e9, 2)} GB" if bpt else "-", fmt(roof, 0)]
        r0 = ratio(qv, lv)
        if depth:
            rd = ratio(qdv, ldv)
            row += [f"{fmt(qdv)}{sd}", fmt(ldv), f"**{fmt(rd, 3)}**" if rd else "-"]
            headline.append(f"- {name}: **{fmt(rd, 3) if rd else '-'}** ({tgd}: qwenrt "
                            f"{fmt(qdv)}{sd} tok/s, llama.cpp {fmt(ldv)} tok/s; at depth 0: "
                            f"{fmt(r0, 3) if r0 else '-'}).")
        row += [f"{fmt(qv)}{s0}", fmt(lv), fmt(r0, 3) if r0 else "-", pct(qv, roof),
                pct(lv, roof)]
        table1.append("| " + " | ".join(row) + " |")
        rp = ratio(qpp, lpp)
        pp_names += [pp] if pp not in pp_names else []
        table2.append(f"| {name} | {fmt(qpp)}{s0} | {fmt(lpp)} | {fmt(rp, 3) if rp else '-'} "
                      f"| {fmt(ql, 2)} / {fmt(ll, 2)} | {mem_str(q0_run)} / {mem_str(lr)} |")

        d = ["", f"## {name}", ""]
        if f.get("like"):
            d.append(f"- File: `qwenrt synth --like {f['like']} --quant {f.get('quant')}"
                     + (f" --layers {f['layers']}" if f.get("layers") else "")
                     + f"`, {fmt(f.get('file_bytes', 0) / 1e9, 2)} GB"
                     + (f"; {fmt(w['tensor_bytes'] / 1e9, 2)} GB of tensors" if w else "") + ".")
        if w and w.get("experts", [0, 0])[1]:
            d.append(f"- Experts: {w['experts'][0]} of {w['experts'][1]} per token, "
                     f"{fmt(w['expert_bytes_used'] / 1e9, 3)} of {fmt(w['expert_bytes'] / 1e9, 2)} GB "
                     "of expert weights read.")
        if bpt:
            d.append(f"- Read per decoded token: {bpt:,.0f} bytes; roofline {fmt(roof, 1)} tok/s.")
        known = ["qwenrt", f"qwenrt-d{depth}", "llamacpp-load", "llamacpp", "qwenrt-batched",
                 "llamacpp-batched", "qwenrt-during-build", f"qwenrt-d{depth}-during-build"]
        stems = [x for x in known if x in runs] + sorted(x for x in runs if x not in known)
        for stem in stems:
            r = runs[stem]
            state = "ok" if ok(r) else f"FAILED (exit {r.get('rc')})"
            extra = f", {fmt(r['wall_s'])} s" if "wall_s" in r else ""
            lq = qwenrt_load(r) if stem.startswith("qwenrt") else None
            extra += f", load_seconds {fmt(lq, 2)}" if lq is not None else ""
            d.append(f"- {stem}: `{shown_cmd(r.get('cmd', ''))}` ({state}{extra}; GPU MiB "
                     f"{mem_str(r)}){' - ' + r['note'] if r.get('note') else ''}")
            if not ok(r) and r.get("stderr_tail"):
                tail = r["stderr_tail"].strip().splitlines()[-3:]
                d.append("  stderr: " + " / ".join(x.strip() for x in tail).replace("|", "\\|"))
        if (m0 and q0_run) or (md and qd_run):
            d.append("- (*) qwenrt figure from the run during the llama.cpp build (no quiet run).")
        rows = []
        for stem in stems:
            if stem.startswith("qwenrt") and ok(runs[stem]):
                for k, v in qwenrt_figures(runs[stem]).items():
                    rows.append((stem, k, v))
        if ok(runs.get("llamacpp")):
            for k, v in llama_figures(runs["llamacpp"]).items():
                rows.append(("llamacpp", k, v))
        if ok(runs.get("llamacpp-batched")):
            out = runs["llamacpp-batched"].get("output") or []
            for e in out if isinstance(out, list) else []:
                if isinstance(e, dict) and "speed_tg" in e:
                    rows.append(("llamacpp-batched", f"pp{e['pp']} tg{e['tg']} x{e['pl']} (decode)",
                                 {"median": e["speed_tg"], "samples": []}))
        if rows:
            d += ["", "| run | test | tok/s (median) | repeats (tok/s) |", "|---|---|---|---|"]
            for stem, k, v in rows:
                d.append(f"| {stem} | {k} | {fmt(v['median'], 2)} | "
                         + ", ".join(fmt(x, 2) for x in v["samples"]) + " |")
        details += d
    if headline:
        lines += ["", f"Headline, qwenrt / llama.cpp decode tok/s at batch 1 after a {depth}-token "
                  "prompt:", ""] + headline
    if files:
        lines += ["", "Decode (batch 1):", ""] + table1
        ppn = "/".join(pp_names) or "pp"
        lines += ["", "Prefill, load and memory:", "",
                  f"| file | qwenrt {ppn} tok/s | llama.cpp {ppn} tok/s | qwenrt / llama.cpp "
                  "| load s qwenrt / llama.cpp | GPU MiB qwenrt / llama.cpp |",
                  "|---|---|---|---|---|---|"] + table2
        if marked_any:
            lines += ["", "(*) from the qwenrt run during the llama.cpp build (no quiet run)."]
    lines += details
    kld = res.get("kld")
    if kld:
        lines += ["", "## KL divergence to qwenrt's reference backend (tools/kld/run.sh)", ""]
        state = "ok" if kld.get("rc") == 0 else f"FAILED (exit {kld.get('rc')})"
        if kld.get("rc") == 124:
            state = "stopped at its time limit (exit 124)"
        wall = f", {fmt(kld['wall_s'])} s" if "wall_s" in kld else ""
        lines.append(f"- Command: `{shown_cmd(kld.get('cmd', ''))}` ({state}{wall}); its files "
                     "kld-summary.json, kld-summary.md and kld-logs.tar.xz came back beside this "
                     "report.")
        md = kld.get("summary_md")
        if md:
            lines.append("")
            for x in md.strip().splitlines():
                lines.append("##" + x if x.startswith("#") else x)
        elif kld.get("log_tail"):
            lines += ["", "```", kld["log_tail"].strip()[-1500:], "```"]
    return "\n".join(lines) + "\n"


def cmd_render(args) -> None:
    with open(args.results, encoding="utf-8") as f:
        res = json.load(f)
    text = render(res, args.bandwidth)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tensors")
    p.add_argument("info")
    p.set_defaults(fn=cmd_tensors)
    p = sub.add_parser("weights")
    p.add_argument("--gguf", required=True)
    p.set_defaults(fn=cmd_weights)
    p = sub.add_parser("collect")
    p.add_argument("work")
    p.set_defaults(fn=cmd_collect)
    p = sub.add_parser("render")
    p.add_argument("results")
    p.add_argument("--out")
    p.add_argument("--bandwidth", type=float, default=DEFAULT_BANDWIDTH)
    p.set_defaults(fn=cmd_render)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
