#!/usr/bin/env python3
"""Cache interop with the PyPI huggingface_hub package (tools/requirements.txt pins it), both
ways, against the fake hub (fake_hub.py, started here on 127.0.0.1):
  (a) a file huggingface_hub downloaded (hf_hub_download) is found by qwenrt offline: `pull`
      prints the same snapshot path, `ls` lists it with its size, `info` opens it; also with a
      refs/main that ends in a newline, as hand-made caches do;
  (b) a file qwenrt downloaded (`pull`, official name and ORG/REPO:QUANT) is found by
      huggingface_hub: try_to_load_from_cache gives its path, scan_cache_dir reports the repo,
      file, size and ref, and hf_hub_download (online and local_files_only) returns it without
      fetching a byte.
Prints one line per check; exits 1 on any failure.

Usage: test_hub_interop.py --qwenrt PATH/qwenrt [--tool ...]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import fake_hub  # noqa: E402

TINY = os.path.join(ROOT, "models", "qwen35-chat-tiny.Q8_0.gguf")
TINY_Q4 = os.path.join(ROOT, "models", "qwen35-chat-tiny.Q4_K_M.gguf")
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
failures = []


def check(name, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + str(detail)}")
    if not ok:
        failures.append(name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwenrt", required=True)
    ap.add_argument("--tool")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="qwenrt-hub-interop-")
    config = {"repos": {
        "ggml-org/Qwen3.6-35B-A3B-GGUF": {"commit": COMMIT, "files": {
            "Qwen3.6-35B-A3B-Q4_K_M.gguf": {"path": TINY_Q4, "lfs": True},
            "Qwen3.6-35B-A3B-Q8_0.gguf": {"path": TINY, "lfs": True},
            "README.md": {"text": "# card\n"}}},
        "someone/Tiny-GGUF": {"commit": COMMIT, "files": {
            "Tiny-Q8_0.gguf": {"path": TINY, "lfs": True},
            "mmproj-Tiny-F16.gguf": {"path": TINY, "lfs": True}}}}}
    config_path = os.path.join(work, "config.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    log_path = os.path.join(work, "requests.jsonl")
    hub, cdn = fake_hub.serve(config_path, os.path.join(work, "ports.json"), log_path)
    endpoint = f"http://127.0.0.1:{hub.server_address[1]}"

    hf_cache = os.path.join(work, "hf-written")
    ours_cache = os.path.join(work, "qwenrt-written")
    # huggingface_hub reads its settings at import: set them first.
    os.environ.update({"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": hf_cache,
                       "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1",
                       "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    for name in ("no_proxy", "NO_PROXY"):  # loopback never through a proxy
        os.environ[name] = ",".join(filter(None, ["127.0.0.1,localhost", os.environ.get(name)]))
    os.environ.pop("HF_TOKEN", None)
    os.environ.pop("HF_HUB_OFFLINE", None)
    import huggingface_hub
    from huggingface_hub import hf_hub_download, scan_cache_dir, try_to_load_from_cache
    print(f"huggingface_hub {huggingface_hub.__version__}")

    def qwenrt(cmd, cache, offline):
        env = dict(os.environ, HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1" if offline else "0",
                   QWENRT_HF_ENDPOINT=endpoint)
        return subprocess.run([args.qwenrt] + cmd, env=env, capture_output=True, text=True)

    def cdn_gets():
        if not os.path.exists(log_path):
            return 0
        with open(log_path) as f:
            return sum(1 for line in f if json.loads(line)["server"] == "cdn"
                       and json.loads(line)["method"] == "GET")

    # (a) huggingface_hub writes, qwenrt reads.
    hf_path = hf_hub_download("ggml-org/Qwen3.6-35B-A3B-GGUF", "Qwen3.6-35B-A3B-Q4_K_M.gguf")
    check("hf_hub_download fetched the file", open(hf_path, "rb").read() == open(TINY_Q4, "rb").read())
    r = qwenrt(["pull", "Qwen3.6-35B-A3B"], hf_cache, offline=True)
    check("qwenrt finds huggingface_hub's file offline", r.returncode == 0
          and r.stdout.strip() == hf_path, (r.returncode, r.stdout, r.stderr))
    r = qwenrt(["ls", "--json"], hf_cache, offline=True)
    listing = json.loads(r.stdout) if r.returncode == 0 else {"files": []}
    sizes = {f["model"]: f["size"] for f in listing["files"]}
    check("qwenrt ls lists it with its size",
          sizes.get("Qwen3.6-35B-A3B:Q4_K_M") == os.path.getsize(TINY_Q4), listing)
    r = qwenrt(["info", "Qwen3.6-35B-A3B", "--json"], hf_cache, offline=True)
    info = json.loads(r.stdout) if r.returncode == 0 else {}
    check("qwenrt info opens it (source commit from refs/main)",
          info.get("qwenrt", {}).get("source", {}).get("commit") == COMMIT, r.stderr)
    ref = os.path.join(hf_cache, "models--ggml-org--Qwen3.6-35B-A3B-GGUF", "refs", "main")
    check("huggingface_hub wrote refs/main without a newline", open(ref).read() == COMMIT)
    with open(ref, "a") as f:
        f.write("\n")
    before = cdn_gets()
    r = qwenrt(["pull", "Qwen3.6-35B-A3B"], hf_cache, offline=False)
    check("refs/main with a newline: found online, nothing fetched",
          r.returncode == 0 and r.stdout.strip() == hf_path and cdn_gets() == before,
          (r.stdout, r.stderr))
    r = qwenrt(["pull", "Qwen3.6-35B-A3B:Q8_0"], hf_cache, offline=True)
    check("an uncached quant offline is an error naming it", r.returncode == 1
          and "Qwen3.6-35B-A3B:Q8_0" in r.stderr and "HF_HUB_OFFLINE" in r.stderr, r.stderr)

    # (b) qwenrt writes, huggingface_hub reads.
    r = qwenrt(["pull", "Qwen3.6-35B-A3B:Q8_0"], ours_cache, offline=False)
    ours = r.stdout.strip()
    check("qwenrt pull downloaded", r.returncode == 0 and os.path.isfile(ours), r.stderr)
    found = try_to_load_from_cache("ggml-org/Qwen3.6-35B-A3B-GGUF", "Qwen3.6-35B-A3B-Q8_0.gguf",
                                   cache_dir=ours_cache)
    check("try_to_load_from_cache finds qwenrt's file", found == ours, (found, ours))
    r = qwenrt(["pull", "someone/Tiny-GGUF:Q8_0"], ours_cache, offline=False)
    check("qwenrt pull ORG/REPO:QUANT", r.returncode == 0, r.stderr)
    info = scan_cache_dir(ours_cache)
    repos = {repo.repo_id: repo for repo in info.repos}
    check("scan_cache_dir sees both repos, no warnings",
          set(repos) == {"ggml-org/Qwen3.6-35B-A3B-GGUF", "someone/Tiny-GGUF"} and not info.warnings,
          (list(repos), info.warnings))
    official = repos.get("ggml-org/Qwen3.6-35B-A3B-GGUF")
    if official is not None:
        revisions = list(official.revisions)
        files = {f.file_name: f for rev in revisions for f in rev.files}
        f = files.get("Qwen3.6-35B-A3B-Q8_0.gguf")
        check("scan_cache_dir: commit, ref and file", len(revisions) == 1
              and revisions[0].commit_hash == COMMIT and set(revisions[0].refs) == {"main"}
              and f is not None, (revisions, files))
        if f is not None:
            sha = hashlib.sha256(open(TINY, "rb").read()).hexdigest()
            check("scan_cache_dir: size and blob named by the sha256",
                  f.size_on_disk == os.path.getsize(TINY) and os.path.basename(str(f.blob_path)) == sha,
                  (f.size_on_disk, f.blob_path))
    before = cdn_gets()
    again = hf_hub_download("ggml-org/Qwen3.6-35B-A3B-GGUF", "Qwen3.6-35B-A3B-Q8_0.gguf",
                            cache_dir=ours_cache)
    local = hf_hub_download("ggml-org/Qwen3.6-35B-A3B-GGUF", "Qwen3.6-35B-A3B-Q8_0.gguf",
                            cache_dir=ours_cache, local_files_only=True)
    check("hf_hub_download returns qwenrt's file without fetching",
          again == ours and local == ours and cdn_gets() == before, (again, local, ours))

    hub.shutdown()
    cdn.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    print(f"{len(failures)} failed" if failures else "all hub interop checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
