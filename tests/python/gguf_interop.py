#!/usr/bin/env python3
"""GGUF interop with the PyPI gguf package, both directions.

1. A file written by qwenrt's writer (gguf_sample) is read by gguf.GGUFReader and by qwenrt
   (`qwenrt info --json`): same metadata (keys, types, values) and tensor table (names, types,
   shapes, absolute data offsets, byte sizes, bytes).
2. A file written by gguf.GGUFWriter with every value type is read by both the same way.
3. `qwenrt info` on the gguf-written file prints its architecture and name.
"""
import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf

failures = []


def check(cond, message):
    if not cond:
        failures.append(message)


def flatten(v):
    if isinstance(v, list):
        return [x for item in v for x in flatten(item)]
    return [v]


def same_scalar(a, b, type_name):
    if type_name in ("float32", "float64"):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b and type(a) is type(b) if type_name == "bool" else a == b


def compare(path: Path, qwenrt: str, label: str):
    ours = json.loads(subprocess.run([qwenrt, "info", "--json", str(path)], check=True,
                                     capture_output=True, text=True).stdout)
    theirs = gguf.GGUFReader(path)
    # GGUFReader reports the header counts as fields too; those are not metadata.
    raw = path.read_bytes()
    fields = [f for f in theirs.fields.values() if not f.name.startswith("GGUF.")]
    check(len(fields) == len(ours["metadata"]),
          f"{label}: {len(fields)} keys in gguf, {len(ours['metadata'])} in qwenrt")
    for field, entry in zip(fields, ours["metadata"]):
        key = field.name
        check(entry["key"] == key, f"{label}: key order: gguf {key}, qwenrt {entry['key']}")
        type_name = field.types[0].name.lower()
        check(entry["type"] == type_name, f"{label}: {key}: type gguf {type_name}, qwenrt {entry['type']}")
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            if len(field.types) > 1:
                elem = field.types[1].name.lower()
            else:  # GGUFReader records no element type for an empty array: read it from the file
                at = field.offset + 8 + int.from_bytes(raw[field.offset:field.offset + 8], "little") + 4
                elem = gguf.GGUFValueType(int.from_bytes(raw[at:at + 4], "little")).name.lower()
            check(entry.get("elem_type") == elem,
                  f"{label}: {key}: element type gguf {elem}, qwenrt {entry.get('elem_type')}")
            want = field.contents() if len(field.types) > 1 else []
            got = flatten(entry["value"])
            elem_leaf = field.types[-1].name.lower()
            check(len(want) == len(got), f"{label}: {key}: {len(want)} items in gguf, {len(got)} in qwenrt")
            check(all(same_scalar(a, b, elem_leaf) for a, b in zip(want, got)),
                  f"{label}: {key}: values differ: gguf {want[:8]} qwenrt {got[:8]}")
        else:
            want = field.contents()
            check(same_scalar(want, entry["value"], type_name),
                  f"{label}: {key}: value gguf {want!r}, qwenrt {entry['value']!r}")

    check(theirs.data_offset == ours["data_offset"],
          f"{label}: data offset gguf {theirs.data_offset}, qwenrt {ours['data_offset']}")
    check(len(theirs.tensors) == len(ours["tensors"]),
          f"{label}: {len(theirs.tensors)} tensors in gguf, {len(ours['tensors'])} in qwenrt")
    for t, o in zip(theirs.tensors, ours["tensors"]):
        check(t.name == o["name"], f"{label}: tensor name gguf {t.name}, qwenrt {o['name']}")
        check(t.tensor_type.name == o["type"], f"{label}: {t.name}: type gguf {t.tensor_type.name}, qwenrt {o['type']}")
        check([int(d) for d in t.shape] == o["shape"], f"{label}: {t.name}: shape gguf {list(t.shape)}, qwenrt {o['shape']}")
        start = ours["data_offset"] + o["offset"]
        check(t.data_offset == start, f"{label}: {t.name}: data offset gguf {t.data_offset}, qwenrt {start}")
        check(t.n_bytes == o["n_bytes"], f"{label}: {t.name}: bytes gguf {t.n_bytes}, qwenrt {o['n_bytes']}")
        check(bytes(t.data.tobytes()) == raw[start:start + o["n_bytes"]], f"{label}: {t.name}: data bytes differ")
    return ours


def write_with_gguf(path: Path):
    w = gguf.GGUFWriter(path, "qwen35moe")
    w.add_name("Qwen3.6-35B-A3B interop")
    w.add_uint8("x.u8", 255)
    w.add_int8("x.i8", -128)
    w.add_uint16("x.u16", 65535)
    w.add_int16("x.i16", -32768)
    w.add_uint32("x.u32", 4294967295)
    w.add_int32("x.i32", -2147483648)
    w.add_float32("x.f32", 1e-6)
    w.add_uint64("x.u64", 2**64 - 1)
    w.add_int64("x.i64", -2**63)
    w.add_float64("x.f64", -1.0 / 3.0)
    w.add_bool("x.bool", False)
    w.add_string("x.str", "Привет, 世界 🙂 <|im_start|>")
    w.add_array("x.strs", ["Ġhello", "ĊĊ", "<|endoftext|>", ""])
    w.add_array("x.ints", [1, 2, 3, -4])
    w.add_array("x.floats", [0.5, -2.25])
    w.add_array("x.bools", [True, False, True])
    rng = np.random.default_rng(7)
    w.add_tensor("a.f32", rng.standard_normal((3, 4, 5)).astype(np.float32))
    w.add_tensor("b.f16", rng.standard_normal((2, 64)).astype(np.float16))
    q = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("c.q8_0", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("d.i32", np.arange(10, dtype=np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwenrt", required=True)
    ap.add_argument("--writer", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for alignment in (32, 64, 4096):
            ours_file = tmp / f"ours_{alignment}.gguf"
            subprocess.run([args.writer, str(ours_file), str(alignment)], check=True)
            ours = compare(ours_file, args.qwenrt, f"qwenrt-written (alignment {alignment})")
            check(ours["alignment"] == alignment, f"alignment {alignment}: qwenrt reads {ours['alignment']}")
            reader = gguf.GGUFReader(ours_file)
            check(reader.fields["sample.u64"].contents() == 18000000000000000000, "sample.u64 value")
            check(reader.fields["sample.string"].contents() == "héllo 世界\n<|im_end|>", "sample.string value")
            check(abs(reader.fields["sample.f32"].contents() - 0.1) < 1e-8, "sample.f32 value")
        theirs_file = tmp / "theirs.gguf"
        write_with_gguf(theirs_file)
        compare(theirs_file, args.qwenrt, "gguf-written")
        info = subprocess.run([args.qwenrt, "info", str(theirs_file)], check=True, capture_output=True,
                              text=True).stdout
        check("architecture:  qwen35moe" in info, f"qwenrt info architecture line missing:\n{info}")
        check("name:          Qwen3.6-35B-A3B interop" in info, f"qwenrt info name line missing:\n{info}")
    if failures:
        print(f"FAIL: {len(failures)} mismatches")
        for f in failures[:50]:
            print("  " + f)
        sys.exit(1)
    print("gguf interop: qwenrt-written files (3 alignments) and a gguf-written file agree")


if __name__ == "__main__":
    main()
