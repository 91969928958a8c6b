#!/usr/bin/env python3
"""Server load benchmark (issue 13): `qwenrt serve` and llama.cpp's `llama-server` side by side on
the same GGUF, the same slots and the same per-slot context, one after the other in one run.

    LLAMACPP_SERVER=1 bash bench/build_llamacpp.sh           # llama-server from the pinned sdist
    .venv/bin/python bench/server_load.py -m models/qwen35-chat-tiny.Q8_0.gguf --parallel 8 \\
        -c 512 -t 1 --out bench/results/server.md

-t 1 by default: on a 2-core machine that also runs the load generator (and often a build), two
threads per server measure thread barriers on oversubscribed cores (bench/results/server-t2.md).

Phases (each server is a fresh process; its exact command is recorded):
  (a) both servers: --clients concurrent streaming /v1/chat/completions (short chat prompts,
      greedy, max_tokens fixed and the stop tokens banned by logit_bias so every reply is
      max_tokens long, thinking off via chat_template_kwargs), --repeats times. Per client: time
      to first token (request sent -> first content delta) and inter-token latency (gaps between
      content deltas); p50 / p99 over all clients of a repeat; aggregate tok/s = completion
      tokens of all clients / wall time of the burst; medians over repeats. The server's RSS is
      sampled every 0.2 s over the phase.
  (b) qwenrt: --disconnect-clients streams that leave after the first 3 content deltas; then
      /metrics must reach 0 running sequences, 0 queued and 0 KV pages in use (the drain time is
      reported).
  (c) qwenrt with --max-queue Q: 10x (slots + Q) concurrent non-streamed requests; 200s vs 429s
      (and whether each 429 carries Retry-After); RSS sampled every 0.2 s, idle vs peak.
  (d) qwenrt: 32 streams, SIGTERM once some have produced tokens; every stream answered 200 must
      end with a finish_reason and [DONE], the process must exit 0, and a new connection after
      the signal must be refused.

The client is asyncio on raw sockets (HTTP/1.1, one connection per request, chunked or
close-delimited bodies): no client library is installed in .venv with an async API we can rely
on, and a thin client keeps the load generator's own CPU use small on a 2-core machine, where it
competes with the server.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LLAMA_SERVER = REPO / "build-llamacpp/build/bin/llama-server"
STOP_TEXT = "<|im_end|><|endoftext|>"
TOPICS = ["rivers", "tea", "owls", "bridges", "clouds", "chess", "maps", "bread", "trains",
          "moss", "glass", "kites", "salt", "bees", "ink", "snow"]


# ---------------------------------------------------------------------------------------------
# helpers shared with bench/cpu_compare.py's way of recording


def shown(p) -> str:
    p = Path(p)
    try:
        return str(p.absolute().relative_to(REPO))
    except ValueError:
        return f".../{p.name}" if p.is_absolute() else str(p)


def shown_cmd(cmd: list[str]) -> str:
    return shlex.join(shown(a) if ("/" in a and Path(a).exists()) else a for a in cmd)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError):
        return None
    return None


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_qwenrt() -> Path:
    """build/qwenrt when it is a Release build at least as new as every file under src/, else
    build-h2/qwenrt."""
    newest_src = max(p.stat().st_mtime for p in (REPO / "src").rglob("*") if p.is_file())
    exe, cache = REPO / "build/qwenrt", REPO / "build/CMakeCache.txt"
    if exe.exists() and cache.exists() and exe.stat().st_mtime >= newest_src and \
            "CMAKE_BUILD_TYPE:STRING=Release" in cache.read_text():
        return exe
    return REPO / "build-h2/qwenrt"


# ---------------------------------------------------------------------------------------------
# a small asyncio HTTP/1.1 client


class Reply:
    def __init__(self):
        self.status = 0
        self.headers: dict[str, str] = {}
        self.t_sent = 0.0
        self.t_first = None       # first content delta
        self.token_times: list[float] = []  # arrival of each content delta
        self.finish_reason = None
        self.done = False         # saw data: [DONE]
        self.completion_tokens = None  # from usage when the server sent it
        self.text = ""            # the streamed content deltas, concatenated
        self.body = b""           # non-streamed body, or the tail of a stream
        self.error = None         # exception text when the exchange failed


async def exchange(port: int, path: str, body: dict, stream: bool, leave_after: int = 0,
                   timeout: float = 600.0, r: Reply | None = None, on_event=None) -> Reply:
    """POST body to path; for a stream, parse SSE events as they arrive (into r, which the caller
    may watch while it fills). leave_after > 0: close the connection after that many content
    deltas (a client that disconnects). on_event(event, arrival_time): called with every parsed
    JSON event of a stream (bench/prefix_cache.py reads usage, timings and tool-call deltas)."""
    r = r if r is not None else Reply()
    data = json.dumps(body).encode()
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
        r.t_sent = time.perf_counter()
        writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        lines = head.decode("latin-1").split("\r\n")
        r.status = int(lines[0].split()[1])
        for l in lines[1:]:
            if ":" in l:
                k, v = l.split(":", 1)
                r.headers[k.strip().lower()] = v.strip()
        chunked = "chunked" in r.headers.get("transfer-encoding", "").lower()
        length = r.headers.get("content-length")

        async def pieces():
            if chunked:
                while True:
                    size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)
                    n = int(size_line.split(b";")[0].strip(), 16)
                    if n == 0:
                        return
                    chunk = await asyncio.wait_for(reader.readexactly(n + 2), timeout)
                    yield chunk[:-2]
            elif length is not None:
                yield await asyncio.wait_for(reader.readexactly(int(length)), timeout)
            else:
                while True:
                    chunk = await asyncio.wait_for(reader.read(65536), timeout)
                    if not chunk:
                        return
                    yield chunk

        if not stream or r.status != 200:
            async for p in pieces():
                r.body += p
            return r
        buf = b""
        async for p in pieces():
            now = time.perf_counter()
            buf += p
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        r.done = True
                        continue
                    try:
                        j = json.loads(payload)
                    except ValueError:
                        continue
                    if on_event is not None:
                        on_event(j, now)
                    if j.get("usage"):
                        r.completion_tokens = j["usage"].get("completion_tokens")
                    for ch in j.get("choices") or []:
                        d = ch.get("delta") or {}
                        if d.get("content") or d.get("reasoning_content"):
                            r.text += d.get("content") or ""
                            r.token_times.append(now)
                            if r.t_first is None:
                                r.t_first = now
                        if ch.get("finish_reason"):
                            r.finish_reason = ch["finish_reason"]
            if leave_after and len(r.token_times) >= leave_after:
                return r
        r.body = buf[-300:]
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError,
            asyncio.LimitOverrunError) as e:
        r.error = f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            writer.close()
    return r


async def get_json_text(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b"\r\n", 1)[0].split()[1])
    if b"chunked" in head.lower():
        out, rest = b"", body
        while rest:
            n_line, _, rest = rest.partition(b"\r\n")
            n = int(n_line.split(b";")[0], 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return status, body.decode(errors="replace")


async def metrics(port: int) -> dict[str, float]:
    _, text = await get_json_text(port, "/metrics")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


class RssSampler:
    """VmRSS of one process every `period` s, in the event loop."""

    def __init__(self, pid: int, period: float = 0.2):
        self.pid, self.period, self.samples = pid, period, []
        self.task = None

    async def _run(self):
        while True:
            v = rss_mib(self.pid)
            if v is not None:
                self.samples.append(v)
            await asyncio.sleep(self.period)

    def __enter__(self):
        self.task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc):
        self.task.cancel()


# ---------------------------------------------------------------------------------------------
# servers


class ServerProc:
    def __init__(self, kind: str, cmd: list[str], port: int):
        self.kind, self.cmd, self.port = kind, cmd, port
        self.log = tempfile.NamedTemporaryFile(prefix=f"{kind}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.startup_s = None

    async def wait_healthy(self, limit: float = 300.0):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < limit:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.kind} exited {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                status, _ = await get_json_text(self.port, "/health")
                if status == 200:
                    self.startup_s = time.perf_counter() - t0
                    return
            except (OSError, ValueError, IndexError):
                pass
            await asyncio.sleep(0.1)
        raise SystemExit(f"{self.kind}: /health not 200 after {limit}s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def qwenrt_cmd(a, port: int, max_queue: int) -> list[str]:
    return [str(a.qwenrt), "serve", "-m", str(a.model), "--backend", "cpu", "-t", str(a.threads),
            "--parallel", str(a.parallel), "-c", str(a.ctx), "--max-queue", str(max_queue),
            "--port", str(port), *(a.serve_arg or [])]


def llama_cmd(a, port: int) -> list[str]:
    # llama-server's -c is the whole KV cache, split over -np slots: P * ctx gives each slot ctx.
    return [str(a.llama_server), "-m", str(a.model), "-t", str(a.threads), "-np", str(a.parallel),
            "-c", str(a.parallel * a.ctx), "--port", str(port), "--jinja"]


# ---------------------------------------------------------------------------------------------
# phases


def chat_body(i: int, a, stops: list[int], stream: bool = True, max_tokens: int | None = None):
    topic = TOPICS[i % len(TOPICS)]
    b = {"model": "m",
         "messages": [{"role": "user", "content": f"Write a short note about {topic} (#{i})."}],
         "temperature": 0, "max_tokens": max_tokens or a.max_tokens, "stream": stream,
         "chat_template_kwargs": {"enable_thinking": False},
         "logit_bias": {str(t): -100 for t in stops}}
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


async def phase_a(srv: ServerProc, a, stops) -> dict:
    # One warm-up request (page faults of the weights, first-call allocations) before measuring.
    await exchange(srv.port, "/v1/chat/completions", chat_body(9999, a, stops), True)
    reps = []
    with RssSampler(srv.proc.pid) as rss:
        for rep in range(a.repeats):
            t0 = time.perf_counter()
            replies = await asyncio.gather(*[
                exchange(srv.port, "/v1/chat/completions", chat_body(rep * 1000 + i, a, stops), True)
                for i in range(a.clients)])
            wall = time.perf_counter() - t0
            ok = [r for r in replies if r.status == 200 and r.t_first is not None and r.done]
            ttft = [r.t_first - r.t_sent for r in ok]
            itl = [y - x for r in ok for x, y in zip(r.token_times, r.token_times[1:])]
            toks = sum((r.completion_tokens if r.completion_tokens is not None else len(r.token_times))
                       for r in ok)
            deltas = sum(len(r.token_times) for r in ok)
            reps.append({"ok": len(ok), "failed": len(replies) - len(ok), "wall": wall,
                         "tokens": toks, "deltas": deltas, "tok_s": toks / wall,
                         "ttft_p50": pct(ttft, 50) if ttft else float("nan"),
                         "ttft_p99": pct(ttft, 99) if ttft else float("nan"),
                         "itl_p50": pct(itl, 50) if itl else float("nan"),
                         "itl_p99": pct(itl, 99) if itl else float("nan"),
                         "errors": sorted({r.error or f"status {r.status}" for r in replies
                                           if r not in ok})[:3],
                         "texts": {i: r.text for i, r in enumerate(replies)}})
            print(f"  {srv.kind} repeat {rep}: {reps[-1]['ok']}/{a.clients} ok, "
                  f"{reps[-1]['tok_s']:.1f} tok/s, ttft p50 {reps[-1]['ttft_p50']:.3f}s, "
                  f"itl p50 {reps[-1]['itl_p50'] * 1e3:.1f}ms", flush=True)
    med = {k: statistics.median(r[k] for r in reps)
           for k in ("tok_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "wall")}
    med["reps"] = reps
    med["texts"] = reps[0]["texts"]  # repeat 0, by client: compared across servers
    for r in reps:
        del r["texts"]
    med["rss_idle"] = rss.samples[0] if rss.samples else float("nan")
    med["rss_peak"] = max(rss.samples) if rss.samples else float("nan")
    return med


async def phase_b(srv: ServerProc, a, stops) -> dict:
    before = await metrics(srv.port)
    sem = asyncio.Semaphore(a.disconnect_concurrency)

    async def one(i):
        async with sem:
            return await exchange(srv.port, "/v1/chat/completions",
                                  chat_body(i, a, stops, max_tokens=256), True, leave_after=3)

    t0 = time.perf_counter()
    replies = await asyncio.gather(*[one(i) for i in range(a.disconnect_clients)])
    t_left = time.perf_counter()
    started = sum(1 for r in replies if r.status == 200 and len(r.token_times) >= 3)
    statuses = {}
    for r in replies:
        key = r.error.split(":")[0] if r.error else str(r.status)
        statuses[key] = statuses.get(key, 0) + 1
    drained, m = None, {}
    while time.perf_counter() - t_left < 60:
        m = await metrics(srv.port)
        if (m.get("qwenrt_running_sequences", 1) == 0 and m.get("qwenrt_kv_pages_in_use", 1) == 0
                and m.get("qwenrt_queue_depth", 1) == 0):
            drained = time.perf_counter() - t_left
            break
        await asyncio.sleep(0.02)
    key = "qwenrt_sequences_cancelled_total"
    return {"clients": a.disconnect_clients, "concurrency": a.disconnect_concurrency,
            "started": started, "statuses": statuses, "wall": t_left - t0,
            "drain_s": drained, "running": m.get("qwenrt_running_sequences"),
            "kv_pages": m.get("qwenrt_kv_pages_in_use"), "queued": m.get("qwenrt_queue_depth"),
            "cancelled": m.get(key, 0) - before.get(key, 0),
            "passed": drained is not None}


async def phase_c(srv: ServerProc, a, stops) -> dict:
    await exchange(srv.port, "/v1/chat/completions", chat_body(9999, a, stops, stream=False), False)
    await asyncio.sleep(1.0)
    idle = rss_mib(srv.proc.pid)
    n = 10 * (a.parallel + a.overload_queue)
    bursts = []
    with RssSampler(srv.proc.pid) as rss:
        for burst in range(a.overload_bursts):
            first = len(rss.samples)
            t0 = time.perf_counter()
            replies = await asyncio.gather(*[
                exchange(srv.port, "/v1/chat/completions",
                         chat_body(burst * 10000 + i, a, stops, stream=False), False)
                for i in range(n)])
            wall = time.perf_counter() - t0
            await asyncio.sleep(1.0)
            by_status = {}
            for r in replies:
                key = r.error.split(":")[0] if r.error else str(r.status)
                by_status[key] = by_status.get(key, 0) + 1
            r429 = [r for r in replies if r.status == 429]
            bursts.append({"by_status": by_status, "wall": wall,
                           "retry_after": sum(1 for r in r429 if "retry-after" in r.headers),
                           "retry_after_values": sorted({r.headers.get("retry-after")
                                                         for r in r429} - {None}),
                           "rss_peak": max(rss.samples[first:] or [float("nan")]),
                           "rss_after": rss_mib(srv.proc.pid)})
    return {"requests": n, "bursts": bursts, "rss_idle": idle, "rss_peak": max(rss.samples),
            "rss_samples": len(rss.samples)}


async def phase_d(srv: ServerProc, a, stops) -> dict:
    n = 32
    watched = [Reply() for _ in range(n)]
    tasks = [asyncio.get_running_loop().create_task(
        exchange(srv.port, "/v1/chat/completions", chat_body(i, a, stops, max_tokens=128), True,
                 timeout=60, r=watched[i]))
        for i in range(n)]
    # SIGTERM once as many streams as there are slots have 4 tokens (the rest wait or prefill).
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 120:
        if sum(1 for r in watched if len(r.token_times) >= 4) >= a.parallel:
            break
        await asyncio.sleep(0.01)
    with_tokens = sum(1 for r in watched if r.token_times)
    srv.proc.send_signal(signal.SIGTERM)
    t_sig = time.perf_counter()
    exited_at = []

    async def watch_exit():  # when the process ends, independent of the clients
        while srv.proc.poll() is None and time.perf_counter() - t_sig < 120:
            await asyncio.sleep(0.02)
        exited_at.append(time.perf_counter() - t_sig)

    watcher = asyncio.get_running_loop().create_task(watch_exit())
    await asyncio.sleep(0.3)
    refused_during = None
    try:
        _, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", srv.port), 5)
        w.close()
        refused_during = False
    except (OSError, asyncio.TimeoutError):
        refused_during = True
    replies = await asyncio.gather(*tasks)
    t_streams = time.perf_counter() - t_sig
    try:
        rc = await asyncio.get_running_loop().run_in_executor(None, srv.proc.wait, 60)
    except subprocess.TimeoutExpired:
        rc = "still running 60 s after SIGTERM"
    await watcher
    t_exit = exited_at[0]
    try:
        _, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", srv.port), 5)
        w.close()
        refused_after = False
    except (OSError, asyncio.TimeoutError):
        refused_after = True
    started = [r for r in replies if r.status == 200]
    complete = [r for r in started if r.done and r.finish_reason and not r.error]
    other = {}
    for r in replies:
        if r.status != 200:
            key = r.error.split(":")[0] if r.error else str(r.status)
            other[key] = other.get(key, 0) + 1
    return {"streams": n, "started": len(started), "complete": len(complete),
            "with_tokens": with_tokens,
            "tokens_of_started": sorted(len(r.token_times) for r in started),
            "finish_reasons": sorted({r.finish_reason for r in complete}),
            "incomplete": [(r.error, r.finish_reason, r.done, len(r.token_times))
                           for r in started if r not in complete][:5],
            "not_started": other, "rc": rc, "streams_s": t_streams, "exit_s": t_exit,
            "refused_during_drain": refused_during, "refused_after_exit": refused_after,
            "passed": len(complete) == len(started) and rc == 0 and refused_after}


# ---------------------------------------------------------------------------------------------


def stop_ids(a) -> list[int]:
    out = subprocess.run([str(a.qwenrt), "tokenize", "-m", str(a.model), "--special", STOP_TEXT],
                         check=True, capture_output=True, text=True).stdout.split()
    return [int(x) for x in out]


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src"],
                               capture_output=True, text=True).stdout.strip()
        return rev + (" (src/ has uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def llama_version(exe: Path) -> str:
    try:
        r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
        return "; ".join(l.strip() for l in (r.stdout + r.stderr).splitlines() if l.strip())[:200]
    except (OSError, subprocess.TimeoutExpired):
        return "?"


async def main_async(a) -> dict:
    res = {"load_before": loadavg(), "started": datetime.datetime.now(datetime.timezone.utc)
           .strftime("%Y-%m-%d %H:%M UTC"), "cmds": {}}
    stops = stop_ids(a)
    res["stops"] = stops
    sides = [("qwenrt", None)] + ([] if a.skip_llamacpp else [("llama-server", None)])
    if a.only_overload:
        sides = []
    res["a"] = {}
    for kind, _ in sides:
        port = free_port()
        cmd = qwenrt_cmd(a, port, a.queue) if kind == "qwenrt" else llama_cmd(a, port)
        srv = ServerProc(kind, cmd, port)
        res["cmds"][f"{kind} (a)" + (", (b)" if kind == "qwenrt" else "")] = shown_cmd(cmd)
        try:
            await srv.wait_healthy()
            print(f"{kind}: up in {srv.startup_s:.1f}s; phase (a)", flush=True)
            res["a"][kind] = await phase_a(srv, a, stops)
            res["a"][kind]["startup_s"] = srv.startup_s
            res["a"][kind]["load"] = loadavg()
            if kind == "qwenrt" and a.disconnect_clients:
                print("qwenrt: phase (b)", flush=True)
                res["b"] = await phase_b(srv, a, stops)
                print(f"  {res['b']}", flush=True)
            if kind == "llama-server" and not a.skip_sigterm:
                # Cheap on llama-server too: SIGTERM on this same process (it ends it).
                print("llama-server: phase (d)", flush=True)
                res["d_llama"] = await phase_d(srv, a, stops)
                print(f"  {res['d_llama']}", flush=True)
        except SystemExit as e:
            res["a"][kind] = {"failed": str(e)[-1500:]}
            print(f"{kind} FAILED: {e}", flush=True)
        finally:
            res["a"].setdefault(kind, {})["rc"] = srv.stop()
            res["a"][kind]["log_tail"] = srv.output()[-1500:]
    if not a.skip_overload:
        port = free_port()
        cmd = qwenrt_cmd(a, port, a.overload_queue)
        res["cmds"]["qwenrt (c)"] = shown_cmd(cmd)
        srv = ServerProc("qwenrt", cmd, port)
        try:
            await srv.wait_healthy()
            print("qwenrt: phase (c)", flush=True)
            res["c"] = await phase_c(srv, a, stops)
            print(f"  {res['c']}", flush=True)
        finally:
            srv.stop()
    if not a.skip_sigterm and not a.only_overload:
        port = free_port()
        cmd = qwenrt_cmd(a, port, a.queue)
        res["cmds"]["qwenrt (d)"] = shown_cmd(cmd)
        srv = ServerProc("qwenrt", cmd, port)
        try:
            await srv.wait_healthy()
            print("qwenrt: phase (d)", flush=True)
            res["d"] = await phase_d(srv, a, stops)
            print(f"  {res['d']}", flush=True)
            res["d"]["log_tail"] = srv.output()[-600:]
        finally:
            srv.stop()
    res["load_after"] = loadavg()
    return res


def fmt_s(x: float) -> str:
    return f"{x * 1e3:.0f} ms" if x < 10 else f"{x:.1f} s"


def report(a, res: dict, argv: list[str]) -> str:
    L = ["# Server load: qwenrt serve vs llama.cpp llama-server (issue 13)", ""]
    L.append(f"Command: `{shown_cmd(argv)}`  ")
    L.append(f"Run: {res['started']}; machine: {cpu_name()}, {os.cpu_count()} logical CPUs, cpu "
             f"backend, {a.threads} threads per server; load average (1/5/15 min) before "
             f"{res['load_before']}, after {res['load_after']}.  ")
    built = datetime.datetime.fromtimestamp(a.qwenrt.stat().st_mtime, datetime.timezone.utc)
    L.append(f"qwenrt: `{shown(a.qwenrt)}` (binary written {built:%Y-%m-%d %H:%M} UTC), working "
             f"tree at git {git_rev()}; llama.cpp: llama-server from the "
             f"llama-cpp-python 0.3.36 sdist (`{llama_version(a.llama_server)}`).  ")
    L.append(f"Model: `{shown(a.model)}`; {a.parallel} slots, {a.ctx} tokens of context per slot "
             f"on both servers.")
    L.append("")
    L.append("Server commands (ports vary per run):")
    L.append("")
    for k, v in res["cmds"].items():
        L.append(f"- {k}: `{v}`")
    L.append("")
    L.append(f"## (a) {a.clients} concurrent streaming chat clients")
    L.append("")
    L.append(f"Each: one short user message, greedy, max_tokens {a.max_tokens} with the stop tokens "
             f"{res['stops']} banned (logit_bias -100, so every reply is {a.max_tokens} tokens), "
             f"thinking off (chat_template_kwargs), stream with include_usage. TTFT: request sent "
             f"-> first content delta; ITL: gaps between content deltas; p50/p99 over all "
             f"clients of a repeat; tok/s: completion tokens of all {a.clients} clients / wall "
             f"time of the burst. Medians of {a.repeats} repeats after one warm-up request.")
    L.append("")
    A = res["a"]
    q, l = A.get("qwenrt", {}), A.get("llama-server", {})
    cols = [("TTFT p50", "ttft_p50", fmt_s), ("TTFT p99", "ttft_p99", fmt_s),
            ("ITL p50", "itl_p50", fmt_s), ("ITL p99", "itl_p99", fmt_s),
            ("aggregate tok/s", "tok_s", lambda x: f"{x:.1f}"),
            ("burst wall", "wall", lambda x: f"{x:.1f} s"),
            ("RSS idle -> peak MiB", None, None)]
    L.append("| | " + " | ".join(c[0] for c in cols) + " |")
    L.append("|---|" + "---|" * len(cols))
    for name, d in (("qwenrt", q), ("llama-server", l)):
        if "tok_s" not in d:
            L.append(f"| {name} | " + " | ".join(["failed"] * len(cols)) + " |")
            continue
        cells = [f(d[k]) for _, k, f in cols[:-1]]
        cells.append(f"{d['rss_idle']:.0f} -> {d['rss_peak']:.0f}")
        L.append(f"| {name} | " + " | ".join(cells) + " |")
    if "tok_s" in q and "tok_s" in l:
        cells = [f"{q[k] / l[k]:.2f}x" if l[k] else "-" for _, k, _ in cols[:-1]]
        cells.append("")
        L.append("| qwenrt / llama-server | " + " | ".join(cells) + " |")
    L.append("")
    if "texts" in q and "texts" in l:
        same = sum(1 for i, t in q["texts"].items() if l["texts"].get(i) == t)
        prefix = [len(os.path.commonprefix([t, l["texts"].get(i, "")])) / max(len(t), 1)
                  for i, t in q["texts"].items()]
        L.append(f"Same greedy reply text on both servers (repeat 0, by client): {same} of "
                 f"{len(q['texts'])}; the common prefix is {statistics.median(prefix):.0%} of "
                 f"qwenrt's text at the median. Ratios: below 1 is better for the latencies, above 1 for "
                 f"tok/s. TTFT includes the wait for a slot ({a.clients} clients, {a.parallel} "
                 f"slots).")
        L.append("")
    for n in a.note or []:
        L.append(f"Note: {n}")
        L.append("")
    L.append("Every repeat (ok clients, tok/s, TTFT p50/p99, ITL p50/p99):")
    L.append("")
    for name, d in (("qwenrt", q), ("llama-server", l)):
        if "reps" in d:
            for i, r in enumerate(d["reps"]):
                L.append(f"- {name} #{i}: {r['ok']}/{r['ok'] + r['failed']} ok, {r['tokens']} "
                         f"tokens ({r['deltas']} deltas), {r['tok_s']:.1f} tok/s, TTFT "
                         f"{fmt_s(r['ttft_p50'])} / {fmt_s(r['ttft_p99'])}, ITL "
                         f"{fmt_s(r['itl_p50'])} / {fmt_s(r['itl_p99'])}"
                         + (f"; failures: {r['errors']}" if r["failed"] else ""))
        elif "failed" in d:
            L.append(f"- {name}: FAILED: `{d['failed'][:600]}`")
    for name, d in (("qwenrt", q), ("llama-server", l)):
        if "startup_s" in d:
            L.append(f"- {name}: /health 200 after {d['startup_s']:.1f} s; exit code on SIGTERM "
                     f"{d.get('rc')}; load average after (a) {d.get('load')}")
    L.append("")
    if "b" in res:
        b = res["b"]
        L.append(f"## (b) {b['clients']} clients that leave after 3 tokens (qwenrt)")
        L.append("")
        L.append(f"{b['clients']} streaming chat requests (max_tokens 256), at most "
                 f"{b['concurrency']} open at once, each closing its connection after the third "
                 f"content delta. Replies: {b['statuses']}; {b['started']} reached 3 tokens; "
                 f"{b['wall']:.1f} s for all. Sequences cancelled (counter delta): "
                 f"{b['cancelled']:.0f}.")
        L.append("")
        if b["passed"]:
            L.append(f"**Pass**: /metrics showed 0 running, 0 queued and 0 KV pages in use "
                     f"{fmt_s(b['drain_s'])} after the last client left.")
        else:
            L.append(f"**FAIL**: 60 s after the last client left /metrics still shows running "
                     f"{b['running']}, queued {b['queued']}, KV pages in use {b['kv_pages']}.")
        L.append("")
    if "c" in res:
        c = res["c"]
        L.append(f"## (c) 10x overload (qwenrt, --max-queue {a.overload_queue})")
        L.append("")
        L.append(f"{len(c['bursts'])} bursts, 1 s apart, of {c['requests']} concurrent non-streamed "
                 f"chat requests each (10 x ({a.parallel} slots + {a.overload_queue} queue)), "
                 f"max_tokens {a.max_tokens}. RSS: VmRSS every 0.2 s ({c['rss_samples']} "
                 f"samples); idle {c['rss_idle']:.1f} MiB after one request, before the first "
                 f"burst; peak over all bursts {c['rss_peak']:.1f} MiB.")
        L.append("")
        L.append("| burst | answers | 429s with Retry-After | wall | RSS peak MiB | RSS 1 s after |")
        L.append("|---|---|---|---|---|---|")
        for i, bu in enumerate(c["bursts"]):
            L.append(f"| {i} | {bu['by_status']} | {bu['retry_after']} (values "
                     f"{bu['retry_after_values']}) | {bu['wall']:.2f} s | {bu['rss_peak']:.1f} | "
                     f"{bu['rss_after']:.1f} |")
        L.append("")
    for key, name in (("d", "qwenrt"), ("d_llama", "llama-server, after its (a)")):
        if key not in res:
            continue
        d = res[key]
        L.append(f"## (d) SIGTERM under load ({name})")
        L.append("")
        L.append(f"32 streaming requests (max_tokens 128); SIGTERM once {a.parallel} streams had "
                 f"4 tokens ({d['with_tokens']} had tokens by then). {d['started']} were "
                 f"answered 200, {d['complete']} of them ended with a finish_reason "
                 f"({d['finish_reasons']}) and [DONE]; not answered 200: "
                 f"{d['not_started'] or 'none'}. All streams ended {d['streams_s']:.1f} s after "
                 f"the signal; the process exited {d['rc']} after {d['exit_s']:.1f} s. A new "
                 f"connection 0.3 s after the signal was "
                 f"{'refused' if d['refused_during_drain'] else 'ACCEPTED'}; after exit "
                 f"{'refused' if d['refused_after_exit'] else 'ACCEPTED'}. Content deltas per "
                 f"started stream: {d['tokens_of_started']}.")
        if d["incomplete"]:
            L.append("")
            L.append(f"Incomplete streams (error, finish_reason, [DONE], deltas), first 5: "
                     f"{d['incomplete']}")
        L.append("")
        L.append(f"**{'Pass' if d['passed'] else 'FAIL'}**.")
        L.append("")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", type=Path, default=REPO / "models/qwen35-chat-tiny.Q8_0.gguf")
    ap.add_argument("--qwenrt", type=Path, default=None, help="default: build/ if current, else build-h2/")
    ap.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    ap.add_argument("--parallel", type=int, default=8, help="slots on both servers")
    ap.add_argument("-c", "--ctx", type=int, default=512, help="context per slot")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--queue", type=int, default=2048, help="qwenrt --max-queue for (a), (b), (d)")
    ap.add_argument("--disconnect-clients", type=int, default=1000)
    ap.add_argument("--disconnect-concurrency", type=int, default=1000)
    ap.add_argument("--overload-queue", type=int, default=16)
    ap.add_argument("--overload-bursts", type=int, default=20)
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--skip-overload", action="store_true")
    ap.add_argument("--skip-sigterm", action="store_true")
    ap.add_argument("--serve-arg", action="append",
                    help="one more argument for `qwenrt serve` (repeatable), e.g. "
                         "--serve-arg=--prefix-cache --serve-arg=off")
    ap.add_argument("--only-overload", action="store_true",
                    help="run (c) alone (no llama-server, no (a), (b), (d)); with --json, the "
                         "per-burst RSS for a memory check")
    ap.add_argument("--note", action="append", help="a line for the report (repeatable)")
    ap.add_argument("--out", type=Path, help="the Markdown report")
    ap.add_argument("--json", type=Path, help="all results as JSON")
    a = ap.parse_args()
    for name in ("no_proxy", "NO_PROXY"):
        os.environ[name] = ",".join(filter(None, ["127.0.0.1,localhost", os.environ.get(name)]))
    a.qwenrt = a.qwenrt or pick_qwenrt()
    res = asyncio.run(main_async(a))
    if a.only_overload:
        c = res.get("c", {})
        print(f"idle {c.get('rss_idle')} MiB; RSS 1 s after each burst: "
              f"{[round(b['rss_after'], 1) for b in c.get('bursts', [])]}")
        text = None
    else:
        text = report(a, res, [Path(sys.executable).name, *sys.argv])
        print(text)
    if a.out and text:
        a.out.write_text(text)
    if a.json:  # everything measured, reply texts and server log tails included (not for commit)
        a.json.write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
