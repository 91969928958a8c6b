#!/usr/bin/env python3
"""Split GGUFs against the PyPI gguf package, both directions.

(a) gguf's GGUFWriter splits the tiny trained model (split_max_tensors, with and without its
    metadata-only first shard); qwenrt opens the first part: `info --json` lists every key of the
    source plus split.no / split.count / split.tensors.count, and every tensor with the type,
    shape, size and part that gguf's GGUFReader finds in the shards; `logits` on the split file
    equals `logits` on the source byte for byte.
(b) qwenrt's writer (gguf/split.h, through `qwenrt_tool split`) splits the same model; gguf's
    GGUFReader reads each part: the split keys (types and values as llama.cpp's gguf-split writes
    them), the other keys in the first part only, and the union of the parts' tensors equal to the
    source's, data included.

Usage: test_gguf_split_interop.py --qwenrt PATH/qwenrt --tool PATH/qwenrt_tool
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

MODEL = Path(__file__).resolve().parents[2] / "models" / "qwen35-chat-tiny.Q8_0.gguf"
IDS = "1,17,256,1000,42,7,99,3000,5,11"


class Failure(Exception):
    pass


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Failure(what)


def gguf_split(src: Path, out: Path, max_tensors: int, small_first: bool) -> list[Path]:
    """The source rewritten by gguf's writer as a split GGUF; the shards' paths."""
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(out, arch, split_max_tensors=max_tensors, small_first_shard=small_first)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    n = len(w.tensors)
    return [out.with_name(f"{out.stem}-{i + 1:05d}-of-{n:05d}.gguf") for i in range(n)]


def info(qwenrt: str, path: Path) -> dict:
    out = subprocess.run([qwenrt, "info", "--json", str(path)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def logits(qwenrt: str, path: Path, out: Path) -> bytes:
    subprocess.run([qwenrt, "logits", "-m", str(path), "--backend", "ref", "--ids", IDS,
                    "--out", str(out)], check=True, capture_output=True)
    return out.read_bytes()


def shard_tensors(shards: list[Path]) -> list[tuple]:
    """(name, type, ne, n_bytes, part, data) over the shards, in order, as gguf reads them."""
    rows = []
    for part, shard in enumerate(shards):
        for t in GGUFReader(shard).tensors:
            rows.append((t.name, t.tensor_type.name, [int(d) for d in t.shape], int(t.n_bytes),
                         part, bytes(np.ascontiguousarray(t.data).view(np.uint8))))
    return rows


def check_gguf_written(qwenrt: str, work: Path, source_info: dict, source_logits: bytes,
                       small_first: bool) -> None:
    tag = "small first shard" if small_first else "tensors in every shard"
    shards = gguf_split(MODEL, work / f"py-{int(small_first)}.gguf", 7, small_first)
    check(len(shards) >= 3, f"{tag}: gguf wrote {len(shards)} shards")
    j = info(qwenrt, shards[0])
    keys = {m["key"]: m for m in j["metadata"]}
    for m in source_info["metadata"]:
        check(m["key"] in keys, f"{tag}: key {m['key']} missing")
        check(keys[m["key"]]["value"] == m["value"], f"{tag}: key {m['key']} differs")
    check(keys["split.count"]["value"] == len(shards) and keys["split.no"]["value"] == 0,
          f"{tag}: split keys {keys.get('split.count')} {keys.get('split.no')}")
    check(len(j["parts"]) == len(shards), f"{tag}: {len(j['parts'])} parts, {len(shards)} shards")
    expected = shard_tensors(shards)
    got = [(t["name"], t["type"], t["shape"], t["n_bytes"], t["part"]) for t in j["tensors"]]
    check(got == [e[:5] for e in expected], f"{tag}: tensor table differs")
    if small_first:
        check(all(t["part"] > 0 for t in j["tensors"]), f"{tag}: a tensor in the first shard")
    check(logits(qwenrt, shards[0], work / f"py-{int(small_first)}.npy") == source_logits,
          f"{tag}: logits differ from the source's")
    print(f"gguf-py split ({tag}): {len(shards)} shards, {len(got)} tensors, logits equal")


def check_ours_read_by_gguf(tool: str, work: Path) -> None:
    out = subprocess.run([tool, "split", str(MODEL), str(work / "ours"), "9"], check=True,
                         capture_output=True, text=True).stdout.split()
    parts = [Path(p) for p in out]
    check(len(parts) >= 3, f"qwenrt wrote {len(parts)} parts")
    source = GGUFReader(MODEL)
    total = len(source.tensors)
    for i, part in enumerate(parts):
        r = GGUFReader(part)
        f = r.fields
        for key, value, vtype in (("split.no", i, GGUFValueType.UINT16),
                                  ("split.count", len(parts), GGUFValueType.UINT16),
                                  ("split.tensors.count", total, GGUFValueType.INT32)):
            check(key in f and f[key].types == [vtype] and f[key].contents() == value,
                  f"part {i + 1}: {key}")
        others = [k for k in f if not k.startswith("GGUF.") and not k.startswith("split.")]
        if i == 0:
            expected = [k for k in source.fields if not k.startswith("GGUF.")]
            check(sorted(others) == sorted(expected), "part 1: keys differ from the source's")
            for k in expected:
                check(f[k].types == source.fields[k].types and
                      f[k].contents() == source.fields[k].contents(), f"part 1: key {k}")
        else:
            check(others == [], f"part {i + 1}: keys beyond split.*: {others}")
    got = [row[:4] + row[5:] for row in shard_tensors(parts)]
    want = [row[:4] + row[5:] for row in shard_tensors([MODEL])]
    check(got == want, "the parts' tensors differ from the source's")
    print(f"qwenrt split read by gguf-py: {len(parts)} parts, {len(got)} tensors, data equal")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwenrt", required=True)
    ap.add_argument("--tool", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            source_info = info(args.qwenrt, MODEL)
            source_logits = logits(args.qwenrt, MODEL, work / "source.npy")
            for small_first in (False, True):
                check_gguf_written(args.qwenrt, work, source_info, source_logits, small_first)
            check_ours_read_by_gguf(args.tool, work)
        except Failure as e:
            print(f"FAIL: {e}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
