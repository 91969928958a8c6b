#!/usr/bin/env python3
"""qwenrt and llama.cpp's llama-bench side by side on the CPU: same GGUF, same machine, one run.

    bash bench/build_llamacpp.sh                          # llama-bench from the pinned sdist
    .venv/bin/python bench/cpu_compare.py -m models/qwen35-chat-tiny.Q8_0.gguf -t 2 \\
        --qwenrt-args "--backend cpu -t 2" --out bench/results/cpu-compare-tiny.md

Per model and per round (--rounds), in this order so that drift hits both tools:
  llama.cpp  llama-bench -m FILE -t T -p P -n N -r R -o json
  qwenrt     qwenrt bench -m FILE -p P -n N -b 0 -r R --json [--qwenrt-args ...]
Each tool is one process per round; its peak RSS is that process's ru_maxrss (os.wait4).
Reported: ppP and tgN tok/s as medians of all repeats of all rounds (every repeat listed), the
ratio qwenrt / llama.cpp, and decode as a share of the measured read bandwidth:
  weight bytes per decoded token * tgN tok/s / bandwidth
where weight bytes per token (from the GGUF's tensor table, PyPI `gguf` package) is every tensor
a token reads: for MoE only expert_used_count / expert_count of each `*_exps` tensor, one row of
token_embd (all of it when it doubles as the output matrix), MTP blocks excluded. KV cache and
recurrent state reads are not counted. Bandwidth: --bandwidth GB/s, else bench/membw.cpp's
read figure for T threads, measured at the start of the run (build-bench/membw).

--skip-qwenrt / --skip-llamacpp measure one side only (e.g. the llama.cpp baseline on files the
reference backend is far too slow for).
"""
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LLAMA_BENCH = REPO / "build-llamacpp/build/bin/llama-bench"
DEFAULT_QWENRT = REPO / "build/qwenrt"
DEFAULT_MEMBW = REPO / "build-bench/membw"


def shown(p) -> str:
    """A path as a report shows it: relative to the repository when inside it, else only its name
    (reports are committed; they hold no absolute paths of the machine)."""
    p = Path(p)
    try:
        return str(p.absolute().relative_to(REPO))
    except ValueError:
        return f".../{p.name}" if p.is_absolute() else str(p)


def pathlike(a: str) -> bool:
    return "/" in a and (a.startswith("/") or Path(a).exists())


def shown_cmd(cmd: list[str]) -> str:
    return shlex.join(shown(a) if pathlike(a) else a for a in cmd)


def cpu_jiffies() -> tuple[int, int]:
    """(busy, steal) jiffies of all CPUs since boot, from /proc/stat."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (f + [0] * 8)[:8]
    return user + nice + system + irq + softirq, steal


def wait_idle(max_wait: float, threshold: float = 0.2, window: float = 3.0) -> float:
    """Wait (at most max_wait s) until other processes use under `threshold` cores on average over
    `window` s; return the seconds waited. For shared machines: a busy core halves llama.cpp's
    OpenMP threads and worse."""
    t0 = time.monotonic()
    while True:
        b0, _ = cpu_jiffies()
        time.sleep(window)
        b1, _ = cpu_jiffies()
        if (b1 - b0) / os.sysconf("SC_CLK_TCK") / window < threshold or time.monotonic() - t0 > max_wait:
            return time.monotonic() - t0


def run_measured(cmd: list[str]) -> tuple[str, str, float, str]:
    """Run cmd; return (stdout, stderr, peak RSS MiB of that one process, the machine's other load:
    CPU time used by everything but this process, and time stolen by the hypervisor, both as
    average cores over its run)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        busy0, steal0 = cpu_jiffies()
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        busy1, steal1 = cpu_jiffies()
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        so, se = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if p.returncode != 0:
        sys.stderr.write(se[-4000:])
        raise SystemExit(f"failed (exit {p.returncode}): {shlex.join(cmd)}")
    hz = os.sysconf("SC_CLK_TCK")
    others = max(0.0, (busy1 - busy0) / hz - ru.ru_utime - ru.ru_stime) / wall
    steal = (steal1 - steal0) / hz / wall
    return so, se, ru.ru_maxrss / 1024.0, f"{others:.2f}/{steal:.2f}"  # ru_maxrss: KiB on Linux


def machine() -> dict:
    info = {"cpu": platform.processor() or "unknown", "logical": os.cpu_count()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        kv = dict(l.split(":", 1) for l in out.splitlines() if ":" in l)
        kv = {k.strip(): v.strip() for k, v in kv.items()}
        info["cpu"] = kv.get("Model name", info["cpu"])
        cores = int(kv.get("Core(s) per socket", "0")) * int(kv.get("Socket(s)", "1"))
        info["cores"] = cores or None
        info["threads_per_core"] = kv.get("Thread(s) per core")
        info["l3"] = kv.get("L3 cache")
    except (OSError, subprocess.CalledProcessError, ValueError):
        pass
    try:
        mem = Path("/proc/meminfo").read_text().split("\n", 1)[0]
        info["mem_gib"] = int(mem.split()[1]) / 2**20
    except (OSError, IndexError, ValueError):
        pass
    return info


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def weight_bytes_per_token(model: Path) -> dict:
    import gguf
    r = gguf.GGUFReader(str(model))

    def field(key, default=None):
        f = r.fields.get(key)
        return f.contents() if f is not None else default

    arch = field("general.architecture")
    n_expert = field(f"{arch}.expert_count", 0) or 0
    n_used = field(f"{arch}.expert_used_count", 0) or 0
    n_block = field(f"{arch}.block_count", 0) or 0
    n_mtp = field(f"{arch}.nextn_predict_layers", 0) or 0
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    total = per_token = experts_all = experts_used = 0
    for t in r.tensors:
        n = int(t.n_bytes)
        total += n
        m = re.match(r"blk\.(\d+)\.", t.name)
        if t.name.startswith("nextn.") or (m and n_mtp and int(m.group(1)) >= n_block - n_mtp):
            continue  # MTP block: not read by plain decode
        if "_exps" in t.name and n_expert:
            experts_all += n
            experts_used += n * n_used / n_expert
            per_token += n * n_used / n_expert
        elif t.name == "token_embd.weight" and not tied:
            rows = 1
            for d in list(t.shape)[1:]:
                rows *= int(d)
            per_token += n / max(rows, 1)
        else:
            per_token += n
    return {"arch": arch, "file_bytes": model.stat().st_size, "tensor_bytes": total,
            "per_token": per_token, "experts": (n_used, n_expert), "expert_bytes": experts_all,
            "expert_bytes_used": experts_used}


def measure_bandwidth(membw: Path, threads: int) -> tuple[float, str, str]:
    """The better of membw's two read figures (4 KiB pages, huge pages) for `threads` threads."""
    cmd = [str(membw), "--threads", str(threads), "--repeats", "11"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    got = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "read" and f[2] == str(threads):
            got[f[1]] = float(f[3])
    if not got:
        raise SystemExit(f"could not parse membw output:\n{out}")
    detail = ", ".join(f"{k} pages {v:.1f}" for k, v in sorted(got.items()))
    return max(got.values()), shown_cmd(cmd), detail


def llama_bench_version(exe: Path) -> str:
    try:
        r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
        text = (r.stdout + r.stderr).strip().splitlines()
        return "; ".join(l.strip() for l in text if l.strip())[:200]
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def qwenrt_version(exe: Path) -> str:
    d = Path(os.path.realpath(exe)).parent
    r = subprocess.run(["git", "-C", str(d), "describe", "--always", "--dirty", "--abbrev=12"],
                       capture_output=True, text=True)
    return f"source commit {r.stdout.strip()}" if r.returncode == 0 else "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, action="append", required=True,
                    help="GGUF file (repeat for several; each gets its own table)")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count(), help="llama.cpp threads (-t)")
    ap.add_argument("-p", "--prompt", type=int, default=512, help="prefill length P (ppP)")
    ap.add_argument("-n", "--gen", type=int, default=128, help="decode steps N (tgN)")
    ap.add_argument("-r", "--repeats", type=int, default=3, help="repeats per process (-r of both)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (processes per tool)")
    ap.add_argument("--llama-bench", type=Path, default=DEFAULT_LLAMA_BENCH)
    ap.add_argument("--llama-args", default="", help="extra llama-bench arguments (one string)")
    ap.add_argument("--qwenrt", type=Path, default=DEFAULT_QWENRT)
    ap.add_argument("--qwenrt-args", default="",
                    help='extra `qwenrt bench` arguments, e.g. "--backend cpu -t 2" (one string)')
    ap.add_argument("--skip-qwenrt", action="store_true")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--bandwidth", type=float, help="read bandwidth GB/s (default: run membw)")
    ap.add_argument("--membw", type=Path, default=DEFAULT_MEMBW)
    ap.add_argument("--wait-idle", type=float, default=0, metavar="S",
                    help="before each process, wait up to S seconds for the machine to be idle")
    ap.add_argument("--note", default="", help="a sentence for the report (e.g. machine load)")
    ap.add_argument("--out", type=Path, help="write the markdown report here")
    args = ap.parse_args()
    if args.skip_qwenrt and args.skip_llamacpp:
        ap.error("nothing to run")
    tools = ([] if args.skip_llamacpp else ["llama.cpp"]) + ([] if args.skip_qwenrt else ["qwenrt"])
    for exe in ([args.llama_bench] if "llama.cpp" in tools else []) + ([args.qwenrt] if "qwenrt" in tools else []):
        if not os.access(exe, os.X_OK):
            ap.error(f"{exe} is not an executable (bench/build_llamacpp.sh builds llama-bench)")

    started = datetime.datetime.now().astimezone()
    load_start = loadavg()
    mach = machine()
    if args.bandwidth:
        bw, bw_cmd = args.bandwidth, "given with --bandwidth"
    elif os.access(args.membw, os.X_OK):
        if args.wait_idle:
            print(f"waited {wait_idle(args.wait_idle):.0f} s for an idle machine", file=sys.stderr, flush=True)
        bw, cmd, detail = measure_bandwidth(args.membw, args.threads)
        bw_cmd = f"`{cmd}`: {detail}"
    else:
        bw, bw_cmd = None, None
    pp, tg = f"pp{args.prompt}", f"tg{args.gen}"
    lb_version = llama_bench_version(args.llama_bench) if "llama.cpp" in tools else None
    q_version = qwenrt_version(args.qwenrt) if "qwenrt" in tools else None

    reports = []
    for model in args.model:
        lcmd = [str(args.llama_bench), "-m", str(model), "-t", str(args.threads), "-p", str(args.prompt),
                "-n", str(args.gen), "-r", str(args.repeats), "-o", "json"] + shlex.split(args.llama_args)
        qcmd = [str(args.qwenrt), "bench", "-m", str(model), "-p", str(args.prompt), "-n", str(args.gen),
                "-b", "0", "-r", str(args.repeats), "--json"] + shlex.split(args.qwenrt_args)
        samples = {tool: {pp: [], tg: []} for tool in tools}
        rss = {tool: [] for tool in tools}
        loads = {tool: [] for tool in tools}
        extra = {}
        for rnd in range(args.rounds):
            for tool in tools:
                if args.wait_idle:
                    waited = wait_idle(args.wait_idle)
                    print(f"[{model.name}] waited {waited:.0f} s for an idle machine", file=sys.stderr, flush=True)
                print(f"[{model.name}] round {rnd + 1}/{args.rounds}: {tool}", file=sys.stderr, flush=True)
                if tool == "llama.cpp":
                    out, _, peak, load = run_measured(lcmd)
                    for rec in json.loads(out):
                        test = pp if rec["n_prompt"] and not rec["n_gen"] else tg if rec["n_gen"] else None
                        if test:
                            samples[tool][test] += [float(x) for x in rec["samples_ts"]]
                            keys = ("build_commit", "build_number", "cpu_info", "backends", "model_type",
                                    "model_size", "model_n_params", "n_batch", "n_ubatch", "type_k",
                                    "type_v", "flash_attn", "use_mmap", "n_threads", "cpu_mask", "poll")
                            extra.setdefault("llama", {k: rec.get(k) for k in keys if k in rec})
                else:
                    out, _, peak, load = run_measured(qcmd)
                    j = json.loads(out)
                    extra["qwenrt_backend"] = j.get("backend")
                    for rec in j["results"]:
                        if rec["test"] in (pp, tg):
                            samples[tool][rec["test"]] += [rec["tokens"] / s for s in rec["seconds"]]
                rss[tool].append(peak)
                loads[tool].append(load)
                print(f"  peak RSS {peak:.0f} MiB, other load (busy/steal cores) {load}", file=sys.stderr, flush=True)
        extra["loads"] = loads
        reports.append((model, lcmd, qcmd, samples, rss, extra, weight_bytes_per_token(model)))

    finished = datetime.datetime.now().astimezone()
    text = render(args, tools, mach, started, finished, load_start, loadavg(), bw, bw_cmd,
                  lb_version, q_version, reports)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


def fmt_bytes(n: float) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def render(args, tools, mach, started, finished, load_start, load_end, bw, bw_cmd, lb_version,
           q_version, reports) -> str:
    pp, tg = f"pp{args.prompt}", f"tg{args.gen}"
    self_cmd = shown_cmd(["python3", "bench/cpu_compare.py"] + sys.argv[1:])
    cores = f"{mach.get('cores')} cores" if mach.get("cores") else ""
    lines = [f"# CPU: {' vs '.join(tools)}: {', '.join(m.name for m, *_ in reports)}", "",
             f"Command: `{self_cmd}`", "",
             f"- Date: {started:%Y-%m-%d %H:%M %Z} to {finished:%H:%M}; load average (1/5/15 min) "
             f"{load_start} at the start, {load_end} at the end.",
             f"- Machine: {mach['cpu']}, {cores}, {mach['logical']} logical CPUs"
             + (f", {mach['mem_gib']:.0f} GiB RAM" if mach.get("mem_gib") else "")
             + (f", L3 {mach['l3']}" if mach.get("l3") else "") + "."]
    if lb_version is not None:
        lines.append(f"- llama.cpp: `llama-bench` from the vendored llama.cpp of llama-cpp-python 0.3.36 "
                     f"(bench/build_llamacpp.sh), `--version`: {lb_version}.")
    if q_version is not None:
        lines.append(f"- qwenrt: {q_version}.")
    if bw:
        lines.append(f"- Read bandwidth: {bw:.1f} GB/s ({args.threads} threads; {bw_cmd}).")
    lines.append(f"- {args.rounds} interleaved round(s) of {args.repeats} repeats per tool "
                 f"({' then '.join(tools)} each round); figures are medians of all repeats.")
    if args.note:
        lines.append(f"- {args.note}")
    for model, lcmd, qcmd, samples, rss, extra, w in reports:
        lines += ["", f"## {shown(model)}", ""]
        if "llama.cpp" in tools:
            lines.append(f"- llama.cpp: `{shown_cmd(lcmd)}`")
            if "llama" in extra:
                e = extra["llama"]
                lines.append("  (" + ", ".join(f"{k} {e[k]}" for k in e) + ")")
        if "qwenrt" in tools:
            lines.append(f"- qwenrt: `{shown_cmd(qcmd)}` (backend: {extra.get('qwenrt_backend')})")
        exp = ""
        if w["experts"][1]:
            exp = (f"; experts: {w['experts'][0]} of {w['experts'][1]} per token, "
                   f"{fmt_bytes(w['expert_bytes_used'])} of {fmt_bytes(w['expert_bytes'])} expert weights")
        lines.append(f"- Weights: {fmt_bytes(w['tensor_bytes'])} in the file, "
                     f"{fmt_bytes(w['per_token'])} read per decoded token{exp}.")
        lines += ["", "| test | " + " | ".join(f"{t} tok/s" for t in tools)
                  + (" | qwenrt / llama.cpp" if len(tools) == 2 else "") + " |",
                  "|---|" + "---|" * len(tools) + ("---|" if len(tools) == 2 else "")]
        med = {t: {k: statistics.median(v) if v else float("nan") for k, v in samples[t].items()} for t in tools}
        for test in (pp, tg):
            row = f"| {test} | " + " | ".join(f"{med[t][test]:.2f}" for t in tools)
            if len(tools) == 2:
                row += f" | {med['qwenrt'][test] / med['llama.cpp'][test]:.3f}"
            lines.append(row + " |")
        if bw:
            row = f"| {tg} share of {bw:.1f} GB/s | " + " | ".join(
                f"{100 * w['per_token'] * med[t][tg] / (bw * 1e9):.1f}%" for t in tools)
            lines.append(row + (" | |" if len(tools) == 2 else " |"))
        lines.append("| peak RSS (MiB, max of rounds) | " + " | ".join(f"{max(rss[t]):.0f}" for t in tools)
                     + (" | |" if len(tools) == 2 else " |"))
        lines += ["", "All repeats (tok/s; rounds separated by |) and per-round medians; per process: peak RSS, "
                  "and the machine's other load during it (cores busy with other processes / cores stolen by "
                  "the hypervisor, averaged over its run):", ""]
        r = args.repeats
        for t in tools:
            for test in (pp, tg):
                v = samples[t][test]
                rounds = [v[i:i + r] for i in range(0, len(v), r)]
                lines.append(f"- {t} {test}: " + " | ".join(", ".join(f"{x:.2f}" for x in q) for q in rounds)
                             + "; medians " + ", ".join(f"{statistics.median(q):.2f}" for q in rounds if q))
            lines.append(f"- {t} peak RSS per round (MiB): " + ", ".join(f"{x:.0f}" for x in rss[t])
                         + "; other load " + ", ".join(extra["loads"][t]))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
