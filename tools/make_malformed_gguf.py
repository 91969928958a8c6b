#!/usr/bin/env python3
"""Writes the malformed-GGUF corpus (tests/fixtures/malformed/) and its manifest.

Every file is built byte by byte with struct, so each one breaks exactly one rule of the format
(or of gguf::Limits) and nothing else. manifest.json maps each malformed file to a substring the
reader's error message must contain (chosen to pin the specific check), and lists the valid
controls, which must open, with their key and tensor counts and the smallest prefix of each that
still opens (used by tests/test_gguf_malformed.cpp's truncate-at-every-offset test).

The `model/` subfolder holds well-formed GGUF files whose model metadata is inconsistent (a tiny
qwen4exp config with one key broken per file) and a control that parses; model/manifest.json maps
each to the substrings model::Config's error must contain (tests/test_model_malformed.cpp). Both
folders seed the fuzzer, which also parses the model config of every file the reader opens.

Deterministic: no randomness, no timestamps. Plain Python 3, standard library only.

    python3 tools/make_malformed_gguf.py [--out tests/fixtures/malformed]
"""

import argparse
import json
import os
import struct

# GGUF metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = (
    range(13))
SCALAR_FORMAT = {
    UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f",
    BOOL: "B", UINT64: "Q", INT64: "q", FLOAT64: "d",
}

# GGML tensor types used here: id -> (elements per block, bytes per block).
F32, F16, Q4_0, Q8_0, Q4_K, Q6_K, I8, I32, F64, BF16 = 0, 1, 2, 8, 12, 14, 24, 26, 28, 30
BLOCK = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q8_0: (32, 34), Q4_K: (256, 144),
         Q6_K: (256, 210), I8: (1, 1), I32: (1, 4), F64: (1, 8), BF16: (1, 2)}

U64_MAX = (1 << 64) - 1


def u32(v, endian="<"):
    return struct.pack(endian + "I", v)


def u64(v, endian="<"):
    return struct.pack(endian + "Q", v)


def gstr(s, length=None, endian="<"):
    """A GGUF string; `length` overrides the stored length (for lies about it)."""
    b = s.encode("utf-8") if isinstance(s, str) else s
    return u64(len(b) if length is None else length, endian) + b


# ---- typed values ---------------------------------------------------------------------------

class V:
    """A metadata value: its type id and its encoded payload (without the type id)."""

    def __init__(self, type_id, payload):
        self.type_id = type_id
        self.payload = payload


def scalar(type_id, v):
    return V(type_id, struct.pack("<" + SCALAR_FORMAT[type_id], v))


def string(s):
    return V(STRING, gstr(s))


def array(elem_type, items, count=None):
    """items: V of elem_type (or raw bytes for hand-made payloads); count overrides the length."""
    body = b"".join(i.payload if isinstance(i, V) else i for i in items)
    n = len(items) if count is None else count
    return V(ARRAY, u32(elem_type) + u64(n) + body)


def nested(depth, leaf_type=UINT32):
    """`depth` levels of arrays around one leaf value: depth=1 is [7]."""
    v = scalar(leaf_type, 7)
    for _ in range(depth):
        v = array(v.type_id, [v])
    return v


def kv(key, value):
    return gstr(key) + u32(value.type_id) + value.payload


# ---- tensors and whole files ----------------------------------------------------------------

class T:
    """A tensor-table entry. `offset=None` lets build() place it; data is generated if None."""

    def __init__(self, name, dims, type_id, offset=None, data=None, n_dims=None):
        self.name, self.dims, self.type_id = name, dims, type_id
        self.offset, self.data, self.n_dims = offset, data, n_dims

    def n_bytes(self):
        elems, nbytes = BLOCK[self.type_id]
        n = 1
        for d in self.dims:
            n *= d
        return n // elems * nbytes

    def info(self):
        n_dims = len(self.dims) if self.n_dims is None else self.n_dims
        return (gstr(self.name) + u32(n_dims) + b"".join(u64(d) for d in self.dims) +
                u32(self.type_id) + u64(self.offset))


def pattern(n, seed):
    """Deterministic filler bytes for tensor data."""
    return bytes((seed * 31 + i * 7) & 0xFF for i in range(n))


def align_up(x, a):
    return (x + a - 1) // a * a


class Built:
    """A file's bytes plus where its sections start (for truncation points)."""

    def __init__(self, data, kv_start, tensor_start, table_end, data_start, data_end):
        self.data = data
        self.kv_start, self.tensor_start, self.table_end = kv_start, tensor_start, table_end
        self.data_start, self.data_end = data_start, data_end


def build(kvs=(), tensors=(), version=3, magic=b"GGUF", alignment=32, n_tensors=None,
          n_kvs=None, raw_kv=b"", raw_tensors=b"", data_pad=True, trailing=b""):
    """Assembles a GGUF file. Tensors without an offset are packed in order at `alignment`."""
    kv_bytes = b"".join(kv(k, v) for k, v in kvs) + raw_kv
    cursor = 0
    for t in tensors:
        if t.offset is None:
            t.offset = align_up(cursor, alignment)
        if t.data is None:
            t.data = pattern(t.n_bytes(), len(t.name))
        cursor = max(cursor, t.offset + len(t.data))
    header = magic + u32(version) + u64(len(tensors) if n_tensors is None else n_tensors) + u64(
        len(kvs) if n_kvs is None else n_kvs)
    table = b"".join(t.info() for t in tensors) + raw_tensors
    head = header + kv_bytes + table
    data_start = align_up(len(head), alignment) if data_pad else len(head)
    out = bytearray(head + b"\0" * (data_start - len(head)))
    data_end = data_start
    for t in tensors:
        if not t.data:
            continue  # a lie about where data is: nothing to write
        begin = data_start + t.offset
        if begin > len(out):
            out += b"\0" * (begin - len(out))
        out[begin:begin + len(t.data)] = t.data
        data_end = max(data_end, begin + len(t.data))
    out += trailing
    return Built(bytes(out), len(header), len(header) + len(kv_bytes), len(head), data_start,
                 data_end)


# ---- positive controls ----------------------------------------------------------------------

def all_types_metadata():
    return [
        ("general.architecture", string("qwen35")),
        ("general.name", string("malformed-corpus control")),
        ("general.alignment", scalar(UINT32, 32)),
        ("test.u8", scalar(UINT8, 255)),
        ("test.i8", scalar(INT8, -128)),
        ("test.u16", scalar(UINT16, 65535)),
        ("test.i16", scalar(INT16, -32768)),
        ("test.u32", scalar(UINT32, 4000000000)),
        ("test.i32", scalar(INT32, -2000000000)),
        ("test.f32", scalar(FLOAT32, 0.5)),
        ("test.bool_true", scalar(BOOL, 1)),
        ("test.bool_false", scalar(BOOL, 0)),
        ("test.string_empty", string("")),
        ("test.string_utf8", string("caf\u00e9 \u4e2d\u6587 \"quoted\"\nnew line")),
        ("test.u64", scalar(UINT64, U64_MAX)),
        ("test.i64", scalar(INT64, -(1 << 63))),
        ("test.f64", scalar(FLOAT64, -1.25e300)),
        ("test.arr_u8", array(UINT8, [scalar(UINT8, i) for i in (0, 1, 255)])),
        ("test.arr_i8", array(INT8, [scalar(INT8, i) for i in (-1, 0, 127)])),
        ("test.arr_u16", array(UINT16, [scalar(UINT16, 1)])),
        ("test.arr_i16", array(INT16, [scalar(INT16, -2), scalar(INT16, 2)])),
        ("test.arr_u32", array(UINT32, [scalar(UINT32, i) for i in range(10)])),
        ("test.arr_i32", array(INT32, [scalar(INT32, -i) for i in range(3)])),
        ("test.arr_f32", array(FLOAT32, [scalar(FLOAT32, f) for f in (0.0, -1.5, 1e30)])),
        ("test.arr_bool", array(BOOL, [scalar(BOOL, b) for b in (1, 0, 1)])),
        ("test.arr_u64", array(UINT64, [scalar(UINT64, U64_MAX)])),
        ("test.arr_i64", array(INT64, [scalar(INT64, -5)])),
        ("test.arr_f64", array(FLOAT64, [scalar(FLOAT64, 2.5)])),
        ("test.arr_empty", array(UINT32, [])),
        ("tokenizer.ggml.tokens",
         array(STRING, [string(s) for s in ("<|im_start|>", "", "hello", "\u0120world", "\n")])),
        ("test.arr_nested", array(ARRAY, [array(UINT32, [scalar(UINT32, 1), scalar(UINT32, 2)]),
                                          array(UINT32, []),
                                          array(STRING, [string("x")])])),
        # The deepest nesting gguf::Limits allows (max_array_depth = 4 levels of arrays).
        ("test.arr_depth4", nested(4)),
    ]


def valid_all_types():
    tensors = [
        T("token_embd.weight", [8, 3], F32),
        T("blk.0.attn_norm.weight", [8], F16),
        T("blk.0.attn_q.weight", [32, 2], Q8_0),
        T("blk.0.ffn_up.weight", [256], Q4_K),
        T("blk.0.ffn_down.weight", [64, 1, 1], Q4_0),
        T("blk.0.pos", [5], I32),
        T("blk.0.ssm_a", [2, 2, 2, 2], BF16),
        T("output.weight", [256, 2], Q6_K),
    ]
    return build(all_types_metadata(), tensors)


def valid_v2_align64():
    """Version 2, alignment 64, tensor table order differs from data order, gaps between data."""
    tensors = [
        T("b", [16], F32, offset=128),
        T("a", [3], I8, offset=0),
        T("c", [32], Q4_0, offset=256),
    ]
    kvs = [("general.architecture", string("qwen35")), ("general.alignment", scalar(UINT32, 64)),
           ("test.strings", array(STRING, [string("a"), string("bc")]))]
    return build(kvs, tensors, version=2, alignment=64)


def valid_metadata_only():
    kvs = [("general.architecture", string("qwen35")), ("test.x", scalar(INT64, 1)),
           ("test.nested", array(ARRAY, [array(STRING, [string("p"), string("q")])]))]
    return build(kvs, [])


# ---- malformed files ------------------------------------------------------------------------

def base_kvs():
    return [("general.architecture", string("qwen35")), ("general.name", string("base"))]


def base_tensors():
    return [T("a", [8], F32), T("b", [4, 2], F16)]


def base():
    return build(base_kvs(), base_tensors())


def one_kv(value, key="test.key"):
    return build([("general.architecture", string("qwen35")), (key, value)], [T("a", [4], F32)])


def with_alignment(value):
    return build([("general.alignment", value)], [T("a", [4], F32)]).data


def header_only(version=3, magic=b"GGUF", n_tensors=0, n_kvs=0, endian="<"):
    return magic + u32(version, endian) + u64(n_tensors, endian) + u64(n_kvs, endian)


def big_endian_file():
    """A complete big-endian v3 file (what llama.cpp's --bigendian converter writes)."""
    e = ">"
    key = gstr("general.architecture", endian=e) + u32(STRING, e) + gstr("qwen35", endian=e)
    info = gstr("a", endian=e) + u32(1, e) + u64(4, e) + u32(F32, e) + u64(0, e)
    head = header_only(3, n_tensors=1, n_kvs=1, endian=e) + key + info
    return head + b"\0" * (align_up(len(head), 32) - len(head)) + struct.pack(">4f", 1, 2, 3, 4)


def tensor_file(*tensors, kvs=None, **kw):
    return build(base_kvs() if kvs is None else kvs, list(tensors), **kw).data


def malformed_cases():
    """(file name, bytes, substring (or list of substrings) the error must contain)."""
    cases = []

    def add(name, data, expect):
        cases.append((name + ".gguf", data, expect))

    b = base()
    good = b.data
    assert b.table_end < b.data_start - 1  # so cutting at data_start - 1 keeps the whole table

    # -- header --
    add("magic_ggml", b"GGML" + good[4:], "not a GGUF file")
    add("magic_lowercase", b"gguf" + good[4:], "not a GGUF file")
    add("magic_zero", b"\0\0\0\0" + good[4:], "not a GGUF file")
    add("empty", b"", "not a GGUF file: 0 bytes")
    add("short_magic", b"GGU", "not a GGUF file: 3 bytes")
    add("version_0", header_only(0), "unsupported GGUF version 0")
    add("version_1", header_only(1), "GGUF version 1 is not supported")
    add("version_4", header_only(4), "unsupported GGUF version 4")
    add("version_max", header_only(0xFFFFFFFF), "unsupported GGUF version 4294967295")
    add("version_big_endian", big_endian_file(), "big-endian GGUF")
    add("tensor_count_huge", header_only(3, n_tensors=1 << 63),
        "tensor count 9223372036854775808 exceeds the limit")
    add("tensor_count_max", header_only(3, n_tensors=U64_MAX), "tensor count 18446744073709551615")
    add("kv_count_huge", header_only(3, n_kvs=1 << 63),
        "metadata key count 9223372036854775808 exceeds the limit")
    add("kv_count_unfit", build(base_kvs(), base_tensors(), n_kvs=1000).data,
        "metadata key count 1000 cannot fit")
    add("tensor_count_unfit", build(base_kvs(), base_tensors(), n_tensors=1000).data,
        "tensor count 1000 cannot fit")
    add("tensor_count_extra",
        build(base_kvs(), [T("a", [8], F32, data=b""), T("b", [4, 2], F16, data=b"")],
              n_tensors=3, data_pad=False).data, "truncated: tensor #2 name")

    # -- keys and values --
    add("key_length_past_end",
        header_only(3, n_kvs=1) + gstr("general.architecture", length=1000) + b"\0" * 20,
        "truncated: metadata key #0 at offset 32 needs 1000 bytes, only 40 left")
    add("key_length_over_cap",
        header_only(3, n_kvs=1) + gstr("general.architecture", length=1 << 40) + b"\0" * 20,
        "string length 1099511627776 exceeds the limit of 67108864 bytes")
    add("key_empty", build([("general.architecture", string("qwen35")), ("", scalar(UINT8, 1))],
                           [T("a", [4], F32)]).data, "metadata key #1 at offset 70 is empty")
    add("key_duplicate",
        build(base_kvs() + [("general.name", string("again"))], base_tensors()).data,
        "duplicate metadata key 'general.name'")
    add("string_past_end", one_kv(V(STRING, u64(5000) + b"short"), "general.name").data,
        "truncated: key 'general.name' at offset")
    add("string_over_cap", one_kv(V(STRING, u64(1 << 62) + b"short"), "general.name").data,
        "string length 4611686018427387904 exceeds the limit of 67108864 bytes")
    add("string_in_array_over_cap",
        one_kv(array(STRING, [string("ok"), V(STRING, u64(1 << 40))])).data,
        "string length 1099511627776 exceeds the limit")
    add("array_past_end", one_kv(array(UINT32, [scalar(UINT32, 1)], count=100000)).data,
        "array of 100000 uint32 values needs at least 400000 bytes")
    add("array_strings_past_end", one_kv(array(STRING, [string("a")], count=50000)).data,
        "array of 50000 string values needs at least 400000 bytes")
    add("array_over_cap", one_kv(array(UINT8, [scalar(UINT8, 1)], count=1 << 32)).data,
        "array length 4294967296 exceeds the limit of 4194304")
    add("array_length_max", one_kv(array(UINT8, [], count=U64_MAX)).data,
        "array length 18446744073709551615 exceeds the limit")
    add("array_nested_depth5", one_kv(nested(5)).data, "arrays nested deeper than 4 levels")
    add("array_nested_depth64", one_kv(nested(64)).data, "arrays nested deeper than 4 levels")
    add("value_type_13", one_kv(V(13, u32(0))).data, "unknown value type 13 (valid: 0..12)")
    add("value_type_max", one_kv(V(0xFFFFFFFF, u32(0))).data, "unknown value type 4294967295")
    add("array_elem_type_unknown", one_kv(V(ARRAY, u32(42) + u64(1) + u32(0))).data,
        ["array element type", "unknown value type 42"])
    add("bool_byte_2", one_kv(V(BOOL, b"\x02")).data, "bool byte is 2, expected 0 or 1")
    add("bool_in_array_0xff", one_kv(array(BOOL, [b"\x01", b"\xff"])).data,
        "bool byte is 255, expected 0 or 1")
    # Keys and names are echoed in messages with control bytes escaped (one printable line).
    add("key_newline_duplicate",
        build([("a\nb", scalar(UINT8, 1)), ("a\nb", scalar(UINT8, 2))], base_tensors()).data,
        "duplicate metadata key 'a\\x0ab'")
    add("tensor_name_escape_sequence",
        tensor_file(T("\x1b[31mred\r", [4], 77, data=b"\0" * 16)),
        "tensor '\\x1b[31mred\\x0d': unknown tensor type id 77")
    add("value_u64_truncated",
        header_only(3, n_kvs=1) + gstr("test.key") + u32(UINT64) + b"\1\2\3",
        "truncated: test.key at offset 44 needs 8 bytes, only 3 left")

    # -- alignment --
    add("alignment_0", with_alignment(scalar(UINT32, 0)), "power of two, got 0")
    add("alignment_3", with_alignment(scalar(UINT32, 3)), "power of two, got 3")
    add("alignment_48", with_alignment(scalar(UINT32, 48)), "power of two, got 48")
    add("alignment_huge", with_alignment(scalar(UINT32, 1 << 31)),
        "general.alignment: 2147483648 exceeds the limit")
    add("alignment_uint64", with_alignment(scalar(UINT64, 32)), "expected type uint32, got uint64")
    add("alignment_int32", with_alignment(scalar(INT32, 32)), "expected type uint32, got int32")
    add("alignment_string", with_alignment(string("32")), "expected type uint32, got string")
    add("offset_unaligned", tensor_file(T("a", [8], F32), T("b", [8], F32, offset=36)),
        "data offset 36 is not a multiple of the alignment 32")
    add("offset_unaligned_align64",
        tensor_file(T("a", [4], F32, offset=0), T("b", [4], F32, offset=32),
                    kvs=[("general.alignment", scalar(UINT32, 64))], alignment=64),
        "data offset 32 is not a multiple of the alignment 64")

    # -- tensor table --
    add("tensor_name_empty", tensor_file(T("a", [4], F32), T("", [4], F32)),
        "tensor #1 at offset 139 has an empty name")
    add("tensor_name_over_cap", tensor_file(T("x" * 1025, [4], F32)),
        "string length 1025 exceeds the limit of 1024 bytes")
    add("tensor_name_duplicate", tensor_file(T("a", [4], F32), T("b", [4], F32), T("a", [4], F32)),
        "duplicate tensor name 'a'")
    add("n_dims_0", tensor_file(T("a", [], F32, data=b"\0" * 4)), "0 dimensions, expected 1..4")
    add("n_dims_5", tensor_file(T("a", [1, 1, 1, 1, 4], F32)), "5 dimensions, expected 1..4")
    add("n_dims_max", tensor_file(T("a", [4], F32, n_dims=0xFFFFFFFF)),
        "4294967295 dimensions, expected 1..4")
    add("dim_zero", tensor_file(T("a", [4, 0], F32, data=b"")), "dimension 1 is 0")
    add("dim_over_int64", tensor_file(T("a", [1 << 63], F32, data=b"")),
        "dimension 0 is 9223372036854775808")
    add("dim_max", tensor_file(T("a", [2, U64_MAX], F32, data=b"")),
        "dimension 1 is 18446744073709551615")
    add("elements_overflow_u64", tensor_file(T("a", [1 << 32, 1 << 32], F32, data=b"")),
        "element count of shape overflows")
    add("elements_overflow_i64", tensor_file(T("a", [1 << 62, 3], F32, data=b"")),
        "element count of shape overflows")
    add("elements_overflow_4d",
        tensor_file(T("a", [1 << 16, 1 << 16, 1 << 16, 1 << 16], F32, data=b"")),
        "element count of shape overflows")
    add("bytes_overflow_f32", tensor_file(T("a", [1 << 31, 1 << 31], F32, data=b"")),
        "byte size overflows 64 bits")
    add("bytes_overflow_f64", tensor_file(T("a", [1 << 61], F64, data=b"")),
        "byte size overflows 64 bits")
    add("block_multiple_q4_0", tensor_file(T("a", [33], Q4_0, data=b"\0" * 18)),
        "needs the first dimension to be a multiple of 32, got 33")
    add("block_multiple_q4_k", tensor_file(T("a", [32, 8], Q4_K, data=b"\0" * 144)),
        "needs the first dimension to be a multiple of 256, got 32")
    add("type_id_77", tensor_file(T("a", [4], 77, data=b"\0" * 16)), "unknown tensor type id 77")
    add("type_id_4_retired", tensor_file(T("a", [4], 4, data=b"\0" * 16)),
        "unknown tensor type id 4")
    add("type_id_36_removed", tensor_file(T("a", [4], 36, data=b"\0" * 16)),
        "unknown tensor type id 36")
    add("type_id_max", tensor_file(T("a", [4], 0xFFFFFFFF, data=b"\0" * 16)),
        "unknown tensor type id 4294967295")
    add("tensor_table_truncated", base().data[:b.data_start - 20], "truncated: tensor 'b'")

    # -- tensor data --
    add("offset_outside_file", tensor_file(T("a", [8], F32), T("b", [8], F32, offset=4096,
                                                                 data=b"")),
        "tensor 'b': data [4096, 4128) lies outside the data section")
    add("offset_plus_size_overflow",
        tensor_file(T("a", [8], F32, offset=U64_MAX - 31, data=b"")),
        "data [18446744073709551584, 18446744073709551615) lies outside the data section")
    add("size_outside_file", tensor_file(T("a", [1 << 40], F32, data=b"\0" * 64)),
        "tensor 'a': data [0, 4398046511104) lies outside the data section")
    add("data_one_byte_short", good[:-1], "tensor 'b': data [32, 48) lies outside the data section")
    add("data_section_missing", good[:b.data_start - 1], "truncated: data section starts at offset")
    add("overlap_partial", tensor_file(T("a", [16], F32, offset=0), T("b", [16], F32, offset=32)),
        "tensors 'a' [0, 64) and 'b' [32, 96) overlap")
    add("overlap_same_offset", tensor_file(T("a", [8], F32, offset=0), T("b", [4], F32, offset=0)),
        "overlap")
    add("overlap_contained",
        tensor_file(T("big", [64], F32, offset=0), T("a", [8], F32, offset=64),
                    T("inner", [8], F32, offset=96, data=b"")),
        "tensors 'big' [0, 256) and 'a' [64, 96) overlap")

    # -- truncations of the base file at points in every section (the C++ test cuts the valid
    # controls at every offset; these pin the message at a few representative ones) --
    cut_points = [
        (2, "not a GGUF file"),
        (6, "truncated: version"),
        (12, "truncated: tensor count"),
        (20, "truncated: metadata key count"),
        (b.kv_start + 3, "cannot fit"),
        (b.tensor_start - 3, "truncated: key 'general.name'"),
        (b.tensor_start + 4, "truncated: tensor #0 name"),
        (b.tensor_start + 8, "truncated: tensor #0 name"),
        (b.tensor_start + 10, "truncated: tensor 'a' dimension count"),
        (b.tensor_start + 15, "truncated: tensor 'a' shape"),
        (b.tensor_start + 25, "truncated: tensor 'a' data offset"),
        (b.data_start - 1, "truncated: data section starts"),
        (b.data_start, "lies outside the data section"),
        (b.data_start + 17, "tensor 'a': data [0, 32) lies outside"),
        (b.data_end - 8, "tensor 'b': data [32, 48) lies outside"),
    ]
    for cut, expect in cut_points:
        add(f"truncated_at_{cut:04d}", good[:cut], expect)
    return cases


# ---- model-level: well-formed files with inconsistent qwen4exp metadata ----------------------

def u32s(values):
    return array(UINT32, [scalar(UINT32, v) for v in values])


def i32s(values):
    return array(INT32, [scalar(INT32, v) for v in values])


def u64s(values):
    return array(UINT64, [scalar(UINT64, v) for v in values])


def bools(values):
    return array(BOOL, [scalar(BOOL, int(v)) for v in values])


# A tiny qwen4exp shape: layer 0 attention (QSA, ratio 4), layer 1 DeltaNet carrying the PLE.
# PLE: 3-grams, 2 heads per n-gram -> 4 heads of prime table sizes over 36 rows of width 4.
QWEN4EXP_PLE_VOCAB = [5, 7, 11, 13]
QWEN4EXP_PLE_ROWS = sum(QWEN4EXP_PLE_VOCAB)


def qwen4exp_kvs():
    a = "qwen4exp."
    offsets = [sum(QWEN4EXP_PLE_VOCAB[:i]) for i in range(len(QWEN4EXP_PLE_VOCAB))]
    return [
        ("general.architecture", string("qwen4exp")),
        ("general.name", string("model-corpus control")),
        (a + "block_count", scalar(UINT32, 2)),
        (a + "context_length", scalar(UINT32, 64)),
        (a + "embedding_length", scalar(UINT32, 8)),
        (a + "attention.layer_norm_rms_epsilon", scalar(FLOAT32, 1e-6)),
        (a + "attention.head_count", scalar(UINT32, 2)),
        (a + "attention.head_count_kv", scalar(UINT32, 1)),
        (a + "attention.key_length", scalar(UINT32, 8)),
        (a + "attention.value_length", scalar(UINT32, 8)),
        (a + "rope.dimension_count", scalar(UINT32, 4)),
        (a + "rope.freq_base", scalar(FLOAT32, 10000.0)),
        (a + "attention.recurrent_layers", bools([False, True])),
        (a + "ssm.conv_kernel", scalar(UINT32, 4)),
        (a + "ssm.state_size", scalar(UINT32, 4)),
        (a + "ssm.group_count", scalar(UINT32, 1)),
        (a + "ssm.time_step_rank", scalar(UINT32, 2)),
        (a + "ssm.inner_size", scalar(UINT32, 8)),
        (a + "expert_count", scalar(UINT32, 4)),
        (a + "expert_used_count", scalar(UINT32, 2)),
        (a + "expert_feed_forward_length", scalar(UINT32, 8)),
        (a + "expert_shared_feed_forward_length", scalar(UINT32, 8)),
        (a + "hyper_connection.count", scalar(UINT32, 4)),
        (a + "hyper_connection.low_rank", scalar(UINT32, 4)),
        (a + "attention.indexer.head_count", scalar(UINT32, 2)),
        (a + "attention.indexer.key_length", scalar(UINT32, 4)),
        (a + "attention.indexer.top_k", scalar(UINT32, 8)),
        (a + "attention.compress_ratios", i32s([4, 0])),
        (a + "ple.layers", i32s([1])),
        (a + "ple.ngram_size", scalar(UINT32, 3)),
        (a + "ple.heads_per_ngram", scalar(UINT32, 2)),
        (a + "ple.conv_kernel", scalar(UINT32, 3)),
        (a + "embedding_length_per_layer_input", scalar(UINT32, 4)),
        (a + "ple.eos_token_id", scalar(UINT32, 15)),
        (a + "ple.layer_multipliers", u64s([4295158889766209, 8433018892997163, 1270917961435699])),
        (a + "ple.head_offsets", u64s(offsets)),
        (a + "ple.head_vocab_sizes", u64s(QWEN4EXP_PLE_VOCAB)),
    ]


def qwen4exp_tensors(ple_dims=(4, QWEN4EXP_PLE_ROWS)):
    tensors = [T("token_embd.weight", [8, 16], F32)]
    if ple_dims:
        tensors.append(T("per_layer_token_embd.weight", list(ple_dims), F32))
    return tensors


def qwen4exp_file(replace=None, drop=(), ple_dims=(4, QWEN4EXP_PLE_ROWS)):
    """The control with `replace` {suffix: value} set and the keys ending in `drop` removed."""
    replace = replace or {}
    kvs = []
    for key, value in qwen4exp_kvs():
        suffix = key[len("qwen4exp."):] if key.startswith("qwen4exp.") else None
        if suffix in drop:
            continue
        kvs.append((key, replace.pop(suffix) if suffix in replace else value))
    kvs += [("qwen4exp." + k, v) for k, v in replace.items()]
    return build(kvs, qwen4exp_tensors(ple_dims)).data


def model_cases():
    """(name, bytes, expected substrings): each breaks one qwen4exp rule the forward relies on."""
    a = "qwen4exp."
    cases = []

    def add(name, data, *expect):
        cases.append((f"qwen4exp_{name}.gguf", data, list(expect)))

    # -- the architecture name, echoed in the message with its control bytes escaped (a fuzzer
    # find: a '\n' in it split the error over two lines) --
    add("arch_control_bytes",
        build([("general.architecture", string("qwe\n\x1b[31m"))], qwen4exp_tensors()).data,
        "general.architecture", "got 'qwe\\x0a\\x1b[31m'")
    # -- layer kinds --
    add("recurrent_layers_short", qwen4exp_file({"attention.recurrent_layers": bools([False])}),
        a + "attention.recurrent_layers", "at least 2 entries", "got 1")
    add("recurrent_layers_not_bool", qwen4exp_file({"attention.recurrent_layers": u32s([0, 1])}),
        a + "attention.recurrent_layers", "expected booleans")
    add("full_attention_interval_zero",
        qwen4exp_file({"full_attention_interval": scalar(UINT32, 0)},
                      drop=("attention.recurrent_layers",)),
        a + "full_attention_interval", "got 0")
    add("conv_kernel_zero", qwen4exp_file({"ssm.conv_kernel": scalar(UINT32, 0)}),
        a + "ssm.conv_kernel", "got 0")
    # A fuzzer find: V heads x state size past int32 (UBSan: signed overflow in the check).
    add("ssm_inner_overflow",
        qwen4exp_file({"ssm.time_step_rank": scalar(UINT32, 1 << 20),
                       "ssm.state_size": scalar(UINT32, 1 << 20)}),
        a + "ssm.inner_size", "expected 1099511627776, got 8")
    # -- QSA --
    add("compress_ratios_missing", qwen4exp_file(drop=("attention.compress_ratios",)),
        f"missing metadata key '{a}attention.compress_ratios'")
    add("compress_ratios_short", qwen4exp_file({"attention.compress_ratios": i32s([4])}),
        a + "attention.compress_ratios", "at least 2 entries, got 1")
    add("compress_ratio_on_deltanet", qwen4exp_file({"attention.compress_ratios": i32s([4, 4])}),
        a + "attention.compress_ratios[1] = 4", "DeltaNet layer")
    add("compress_ratio_negative", qwen4exp_file({"attention.compress_ratios": i32s([-4, 0])}),
        a + "attention.compress_ratios'[0]", "got -4")
    add("indexer_budget_not_multiple",
        qwen4exp_file({"attention.compress_ratios": i32s([3, 0])}),
        a + "attention.indexer.top_k", "not a multiple")
    add("indexer_key_length_short",
        qwen4exp_file({"attention.indexer.key_length": scalar(UINT32, 2)}),
        a + "attention.indexer.key_length", "rotated dims")
    add("indexer_heads_missing", qwen4exp_file(drop=("attention.indexer.head_count",)),
        f"missing metadata key '{a}attention.indexer.head_count'")
    # -- hyper-connections --
    add("hc_count_one", qwen4exp_file({"hyper_connection.count": scalar(UINT32, 1)}),
        a + "hyper_connection.count", "got 1")
    add("hc_low_rank_zero", qwen4exp_file({"hyper_connection.low_rank": scalar(UINT32, 0)}),
        a + "hyper_connection.low_rank", "got 0")
    # -- PLE: layers, conv, n-gram hash parameters, table --
    add("ple_layer_attention", qwen4exp_file({"ple.layers": i32s([0])}),
        a + "ple.layers", "DeltaNet")
    add("ple_layers_two", qwen4exp_file({"ple.layers": i32s([0, 1])}),
        a + "ple.layers", "one PLE layer")
    add("ple_layer_out_of_range", qwen4exp_file({"ple.layers": i32s([2])}),
        a + "ple.layers'[0]", "got 2")
    add("ple_conv_kernel_zero", qwen4exp_file({"ple.conv_kernel": scalar(UINT32, 0)}),
        a + "ple.conv_kernel", "got 0")
    add("ple_ngram_one", qwen4exp_file({"ple.ngram_size": scalar(UINT32, 1)}),
        a + "ple.ngram_size", "got 1")
    add("ple_heads_per_ngram_zero", qwen4exp_file({"ple.heads_per_ngram": scalar(UINT32, 0)}),
        a + "ple.heads_per_ngram", "got 0")
    add("ple_multipliers_short", qwen4exp_file({"ple.layer_multipliers": u64s([3, 5])}),
        a + "ple.layer_multipliers", "at least 3 entries, got 2")
    add("ple_multiplier_zero", qwen4exp_file({"ple.layer_multipliers": u64s([3, 0, 5])}),
        a + "ple.layer_multipliers'[1]", "got 0")
    add("ple_multipliers_not_integers",
        qwen4exp_file({"ple.layer_multipliers":
                       array(FLOAT32, [scalar(FLOAT32, 1.5)] * 3)}),
        a + "ple.layer_multipliers", "expected integers")
    add("ple_eos_negative", qwen4exp_file({"ple.eos_token_id": scalar(INT32, -1)}),
        a + "ple.eos_token_id", "got -1")
    add("ple_head_vocab_zero", qwen4exp_file({"ple.head_vocab_sizes": u64s([5, 7, 0, 13])}),
        a + "ple.head_vocab_sizes'[2]", "got 0")
    add("ple_head_vocab_short", qwen4exp_file({"ple.head_vocab_sizes": u64s([5, 7, 11])}),
        a + "ple.head_vocab_sizes", "at least 4 entries, got 3")
    add("ple_head_offset_past_table", qwen4exp_file({"ple.head_offsets": u64s([0, 5, 12, 30])}),
        a + "ple.head_offsets", "head 3", "per_layer_token_embd.weight")
    add("ple_head_offset_huge", qwen4exp_file({"ple.head_offsets": u64s([0, 5, 12, 1 << 40])}),
        a + "ple.head_offsets'[3]", "expected a value in")
    add("ple_table_missing", qwen4exp_file(ple_dims=None),
        "missing tensor 'per_layer_token_embd.weight'")
    add("ple_table_width", qwen4exp_file(ple_dims=(8, QWEN4EXP_PLE_ROWS)),
        "per_layer_token_embd.weight", "expected shape [4, rows]", "got [8, 36]")
    return cases


def valid_cases():
    return [("valid_all_types.gguf", valid_all_types(), 32, 8),
            ("valid_v2_align64.gguf", valid_v2_align64(), 3, 3),
            ("valid_metadata_only.gguf", valid_metadata_only(), 3, 0)]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "malformed"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    manifest = {"malformed": {}, "valid": {}}
    for name, data, expect in malformed_cases():
        assert name not in manifest["malformed"], name
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(data)
        manifest["malformed"][name] = expect
    for name, built, n_keys, n_tensors in valid_cases():
        with open(os.path.join(args.out, name), "wb") as f:
            f.write(built.data)
        # A prefix opens iff it holds everything up to the end of the last tensor's data (or,
        # with no tensors, the end of the tensor table).
        min_size = built.data_end if n_tensors else built.tensor_start
        manifest["valid"][name] = {"keys": n_keys, "tensors": n_tensors, "min_size": min_size}
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out)
                if n.endswith(".gguf"))
    print(f"wrote {len(manifest['malformed'])} malformed + {len(manifest['valid'])} valid files "
          f"({total} bytes) to {args.out}")

    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    model_manifest = {"malformed": {}, "valid": ["qwen4exp_valid.gguf"]}
    with open(os.path.join(model_dir, "qwen4exp_valid.gguf"), "wb") as f:
        f.write(qwen4exp_file())
    for name, data, expect in model_cases():
        assert name not in model_manifest["malformed"], name
        with open(os.path.join(model_dir, name), "wb") as f:
            f.write(data)
        model_manifest["malformed"][name] = expect
    with open(os.path.join(model_dir, "manifest.json"), "w") as f:
        json.dump(model_manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(model_dir, n)) for n in os.listdir(model_dir))
    print(f"wrote {len(model_manifest['malformed'])} malformed + 1 valid model files "
          f"({total} bytes) to {model_dir}")


if __name__ == "__main__":
    main()
