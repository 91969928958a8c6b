#!/usr/bin/env python3
"""Decode under a memory budget: qwenrt (routed experts streamed through its cache) against
llama.cpp (the whole file mapped) on the same GGUF, each run inside a memory cgroup whose limit is
the budget (page cache counted, as the kernel counts it), one run after the other.

For each budget and engine: the file is dropped from the page cache, the engine runs a short and
a long decode in a fresh cgroup, and the disk bytes it read (getrusage ru_inblock) are taken per
decoded token from the difference of the two (so loading and prefill cancel out). qwenrt picks
its cache from the free memory it sees (the cgroup's headroom) unless --qwenrt-cache is given.

    sudo python3 bench/expert_stream_compare.py --model build-bench/flashnext.gguf \
        --budgets 2,3,4.5 --qwenrt build/qwenrt \
        --llama build-llamacpp/build/bin/llama-bench --json out.json

Needs a writable memory cgroup: v1 (/sys/fs/cgroup/memory) or v2 (a folder of the current
cgroup with the memory controller enabled). A budget of 0 means no limit (the file warm in the
page cache first). Linux only.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

GiB = 1 << 30


class Cgroup:
    """A fresh memory cgroup with a limit; v1 or v2, whichever this machine offers writable."""

    def __init__(self, name, limit):
        v1 = "/sys/fs/cgroup/memory"
        if os.path.isdir(v1) and os.access(v1, os.W_OK):
            self.v2, self.dir = False, os.path.join(v1, name)
        else:
            with open("/proc/self/cgroup") as f:
                path = [ln.split(":", 2)[2].strip() for ln in f if ln.startswith("0::")][0]
            self.v2, self.dir = True, os.path.join("/sys/fs/cgroup" + path, name)
        if os.path.isdir(self.dir):
            os.rmdir(self.dir)
        os.mkdir(self.dir)
        self.limit = limit
        if limit:
            self._write("memory.max" if self.v2 else "memory.limit_in_bytes", str(limit))

    def _write(self, name, text):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def _read(self, name):
        with open(os.path.join(self.dir, name)) as f:
            return f.read()

    def enter(self):
        """Runs in the child before exec."""
        self._write("cgroup.procs", str(os.getpid()))

    def peak(self):
        try:
            return int(self._read("memory.peak" if self.v2 else "memory.max_usage_in_bytes"))
        except OSError:
            return None

    def close(self):
        for _ in range(50):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.1)


def drop_from_page_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_page_cache(path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def run_in_cgroup(cmd, budget, tag):
    group = Cgroup(f"qwenrt-bench-{os.getpid()}-{tag}", int(budget * GiB) if budget else 0)
    try:
        start = time.monotonic()
        env = dict(os.environ, QWENRT_LOG="info")  # qwenrt logs the cache it chose
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                preexec_fn=group.enter)
        out, err = proc.communicate()
        wall = time.monotonic() - start
        return proc.returncode, out.decode(), err.decode(), wall, group.peak()
    finally:
        group.close()


def children_inblock():
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock


def measure(engine, cmd_for, model, budget, n_short, n_long):
    """Runs the short and the long decode cold; returns the long run's parse and bytes/token."""
    runs = {}
    for n in (n_short, n_long):
        if budget:
            drop_from_page_cache(model)
        else:
            warm_page_cache(model)
        before = children_inblock()  # RUSAGE_CHILDREN accumulates: difference around the run
        rc, out, err, wall, peak = run_in_cgroup(cmd_for(n), budget, f"{engine}-{n}")
        read = (children_inblock() - before) * 512
        if rc != 0:
            # SIGKILL under a limit is the cgroup's OOM killer: a result, not a harness failure.
            if rc == -9 and budget:
                return None, f"killed by the OOM killer under the {budget} GiB limit"
            sys.exit(f"{engine} failed (budget {budget} GiB, rc {rc}):\n{err[-3000:]}")
        runs[n] = {"out": out, "err": err, "bytes_read": read, "wall_s": wall, "peak": peak}
    long = runs[n_long]
    return long, (long["bytes_read"] - runs[n_short]["bytes_read"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--budgets", default="0,2,3,4.5", help="GiB, comma-separated; 0: no limit")
    ap.add_argument("--qwenrt", default="build/qwenrt")
    ap.add_argument("--llama", default="build-llamacpp/build/bin/llama-bench")
    ap.add_argument("--qwenrt-cache", type=float, default=None,
                    help="GiB for --expert-cache (default: qwenrt chooses from the headroom)")
    ap.add_argument("-n", type=int, default=32, help="decode tokens of the long run")
    ap.add_argument("--short", type=int, default=8, help="decode tokens of the short run")
    ap.add_argument("-r", type=int, default=2, help="repeats inside each run")
    ap.add_argument("-t", type=int, default=2, help="threads")
    ap.add_argument("--engines", default="qwenrt,llama.cpp")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    for engine, path in (("qwenrt", args.qwenrt), ("llama.cpp", args.llama)):
        if engine in args.engines.split(",") and not os.access(path, os.X_OK):
            sys.exit(f"expert_stream_compare: no {engine} binary at {path} (--qwenrt / --llama)")

    def qwenrt_cmd(cache):
        def cmd(n):
            c = [args.qwenrt, "bench", "-m", args.model, "-p", "16", "-n", str(n), "-b", "0",
                 "-r", str(args.r), "-t", str(args.t), "--backend", "cpu", "--json"]
            return c + (["--expert-cache", str(cache)] if cache is not None else [])
        return cmd

    def llama_cmd(n):
        return [args.llama, "-m", args.model, "-p", "0", "-n", str(n), "-r", str(args.r),
                "-t", str(args.t), "-o", "json"]

    results = []
    for budget in [float(b) for b in args.budgets.split(",")]:
        for engine in args.engines.split(","):
            cache = args.qwenrt_cache
            if not budget and cache is None:
                cache = 0  # no limit: map everything, like llama.cpp
            cmd_for = qwenrt_cmd(cache) if engine == "qwenrt" else llama_cmd
            run, decode_bytes = measure(engine, cmd_for, args.model, budget, args.short, args.n)
            if run is None:  # decode_bytes holds why
                results.append({"engine": engine, "budget_gib": budget, "error": decode_bytes})
                print(f"budget {budget:4.1f} GiB  {engine:9s}  {decode_bytes}", flush=True)
                continue
            if engine == "qwenrt":
                bench = json.loads(run["out"])
                tg = [r for r in bench["results"] if r["test"] == f"tg{args.n}"][0]
                row = {"tok_s": tg["tok_s_median"], "tok_s_all": [args.n / s for s in tg["seconds"]],
                       "experts": tg.get("experts")}
                chosen = [ln for ln in run["err"].splitlines() if "streaming the experts" in ln]
                row["cache_note"] = chosen[0].strip() if chosen else (
                    f"--expert-cache {cache}" if cache is not None else "")
            else:
                tests = json.loads(run["out"])
                tg = [t for t in tests if t["n_gen"] == args.n][0]
                row = {"tok_s": tg["avg_ts"], "tok_s_all": tg.get("samples_ts")}
            tokens = (args.n - args.short) * args.r
            row.update({"engine": engine, "budget_gib": budget,
                        "disk_mb_per_token": decode_bytes / tokens / 1e6,
                        "peak_cgroup_mib": run["peak"] / 2**20 if run["peak"] else None,
                        "wall_s": run["wall_s"]})
            results.append(row)
            print(f"budget {budget:4.1f} GiB  {engine:9s}  tg{args.n} {row['tok_s']:6.2f} tok/s  "
                  f"disk {row['disk_mb_per_token']:7.1f} MB/token  "
                  f"peak {row['peak_cgroup_mib'] or 0:7.0f} MiB  "
                  + (f"hits {row['experts']['hits'] / max(row['experts']['lookups'], 1):.1%}"
                     if row.get("experts") else ""), flush=True)
    doc = {"model": args.model, "model_bytes": os.path.getsize(args.model), "n": args.n,
           "short": args.short, "repeats": args.r, "threads": args.t,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": " ".join(sys.argv), "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
