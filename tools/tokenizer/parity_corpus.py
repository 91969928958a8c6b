"""Deterministic test strings for tokenizer parity (tests/python/tokenizer_parity.py) and the
benchmark (bench/tokenizer/). Everything comes from a seeded RNG and the lists below.

Each item is bytes, not str: some are deliberately invalid UTF-8.
"""

import random
import unicodedata

ENGLISH = """the of and to in is it that for on with as was at by be this have from or one had not
but what all were when we there can an your which their said if do will each about how up out them
then she many some so these would other into has more her two like him see time could no make than
first been its who now people my made over did down only way find use may water long little very
after words called just where most know get through back much before go good new write our used me
man too any day same right look think also around another came come work three word must because
does part even place well such here take why things help put years different away again off went
Hello World NASA iPhone McDonald O'Neil DON'T I'M YOU'LL WE'D It'S""".split()

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL",
                "'lL", "'D", "'ſ", "'x", "'", "''", "’s", "'K"]

SCRIPTS = {
    "cjk": [(0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3), (0x3400, 0x4DBF),
            (0xFF01, 0xFF5E), (0x3000, 0x303F), (0x20000, 0x2A6DF)],
    "cyrillic": [(0x0400, 0x04FF)],
    "arabic": [(0x0600, 0x06FF), (0x0750, 0x077F)],
    "hebrew": [(0x0590, 0x05FF)],
    "devanagari": [(0x0900, 0x097F)],
    "thai": [(0x0E00, 0x0E7F)],
    "greek": [(0x0370, 0x03FF), (0x1F00, 0x1FFF)],
    "latin_ext": [(0x00C0, 0x024F), (0x1E00, 0x1EFF)],
    "hangul_jamo": [(0x1100, 0x11FF)],
    "marks": [(0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0x0591, 0x05C7)],
    "numbers": [(0x0660, 0x0669), (0x06F0, 0x06F9), (0x0966, 0x096F), (0xFF10, 0xFF19), (0x2150, 0x218B),
                (0x2460, 0x249B), (0x00B2, 0x00B3), (0x00BC, 0x00BE), (0x1D7CE, 0x1D7FF)],
    "symbols": [(0x2000, 0x206F), (0x2190, 0x22FF), (0x2500, 0x25FF), (0x20A0, 0x20C0), (0x00A1, 0x00BF)],
}

EMOJI = ["🦙", "🚀", "😁", "✅", "🔥", "😶\u200d🌫️", "👩\u200d💻", "👍🏽", "🇫🇷", "🇯🇵", "❤️", "1️⃣", "🏳️\u200d🌈",
         "👨\u200d👩\u200d👧\u200d👦", "©", "™", "🫠", "\U0001F9D1\u200d\U0001F91D\u200d\U0001F9D1"]

CODE = [
    "def {a}({b}, {c}):\n    return {b} + {c}\n",
    "for (size_t i = 0; i < {n}; ++i) {{ {a}[i] += {b}[i]; }}\n",
    "if ({a} != nullptr && {b}->{c} >= {n}) {{\n\treturn -1;\n}}\r\n",
    "{{\"{a}\": [{n}, {n}.5, -{n}e-3], \"{b}\": null, \"ok\": true}}",
    "SELECT {a}, COUNT(*) FROM {b} WHERE {c} > {n} GROUP BY {a};",
    "<div class=\"{a}\">{b} &amp; {c}</div>\n",
    "$ {a} --{b}={n} | grep -E '^{c}+$' >> /tmp/{a}.log 2>&1",
    "    # TODO({a}): {b}!!! ... --> {c}()\n\n\n",
    "x = {n}_{n}; y = 0x{n}ff; z = {n}.{n}f; w = 1e{n}",
]

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
           "</tool_call>", "<|fim_prefix|>", "<tool_response>", "<|vision_pad|>", "<|im_", "|>",
           "<<|im_end|>>", "<|im_start|><|im_start|>", "< think>", "<THINK>", "<|tts_pad|>"]

WHITESPACE = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\t\n", "\n \n", "\u00a0", "\u3000",
              "\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\u2003", "\u200b", "\ufeff", "\x1c", "\u180e", "\u202f"]

INVALID = [b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xc2", b"\xdf", b"\xe0\x80", b"\xe0\xa0",
           b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xef\xbf", b"\xf0\x80\x80\x80", b"\xf0\x9f", b"\xf0\x9f\x98",
           b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff", b"\xe2\x82",
           b"\xc3\x28", b"\xe1\x80\x41"]


def _script_text(rng: random.Random, ranges, n: int) -> str:
    out = []
    while len(out) < n:
        lo, hi = rng.choice(ranges)
        ch = chr(rng.randint(lo, hi))
        if unicodedata.category(ch) not in ("Cn", "Cs", "Co"):
            out.append(ch)
    return "".join(out)


def _words(rng, n):
    parts = []
    for _ in range(n):
        w = rng.choice(ENGLISH)
        r = rng.random()
        if r < 0.1:
            w = w.upper()
        elif r < 0.2:
            w = w.capitalize()
        if rng.random() < 0.15:
            w += rng.choice(CONTRACTIONS)
        parts.append(w)
        parts.append(rng.choice([" ", " ", " ", ", ", ". ", "! ", "? ", " - ", "  ", "\n", ": ", "; "]))
    return "".join(parts).rstrip()


def _any_codepoint(rng) -> str:
    while True:
        ch = chr(rng.randint(0, 0x10FFFF) if rng.random() < 0.3 else rng.randint(0, 0x2FFF))
        if unicodedata.category(ch) not in ("Cn", "Cs"):
            return ch


def _item(rng: random.Random, kind: str) -> bytes:
    if kind == "english":
        return _words(rng, rng.randint(1, 40)).encode()
    if kind in SCRIPTS:
        n = rng.randint(1, 60)
        text = _script_text(rng, SCRIPTS[kind], n)
        if rng.random() < 0.5:  # words and spaces
            text = " ".join(text[i:i + rng.randint(1, 8)] for i in range(0, len(text), 5))
        if kind == "marks":  # marks after bases, in any order (NFC reorders and composes)
            text = "".join(rng.choice("aeiouAEOnyçw ") + text[i:i + rng.randint(1, 4)] for i in range(0, len(text), 3))
        if rng.random() < 0.3:
            text = unicodedata.normalize(rng.choice(["NFD", "NFKD", "NFC"]), text)
        return text.encode()
    if kind == "emoji":
        return "".join(rng.choice(EMOJI) + rng.choice(["", "", " ", "x", ".", "\n", "a"]) for _ in range(rng.randint(1, 12))).encode()
    if kind == "code":
        fill = lambda: rng.choice(ENGLISH).lower()  # noqa: E731
        return "".join(rng.choice(CODE).format(a=fill(), b=fill(), c=fill(), n=rng.randint(0, 99999))
                       for _ in range(rng.randint(1, 4))).encode()
    if kind == "digits":
        return "".join(rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 30))), " ", ".", ",", "-", "3" * rng.randint(1, 70),
                                   "½", "²", "١٢٣", "１２", "Ⅻ", "①", "e10", "$", "%"]) for _ in range(rng.randint(1, 10))).encode()
    if kind == "whitespace":
        return "".join(rng.choice(WHITESPACE) * rng.randint(1, 5) + rng.choice(["", "", "a", "Hello", "!", "1", "'s", "中", "\u0301"])
                       for _ in range(rng.randint(1, 10))).encode()
    if kind == "special":
        return "".join(rng.choice([rng.choice(SPECIAL), _words(rng, rng.randint(0, 3)), "\n", " ", "user\n", "<", ">", "|"])
                       for _ in range(rng.randint(1, 8))).encode()
    if kind == "invalid":
        parts = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(INVALID))
            elif r < 0.6:
                parts.append(bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 6))))
            elif r < 0.8:
                parts.append(rng.choice(EMOJI).encode()[: rng.randint(1, 3)])
            else:
                parts.append(_words(rng, 2).encode())
        return b"".join(parts)
    if kind == "long":  # pieces longer than the BPE's short-word path
        unit = rng.choice(["a", "ab", "的", "ー", " ", "\n", "-", "=", "ü", "😀", "x\u0301", "é", "aé", "1"])
        body = unit * rng.randint(20, 400)
        return (rng.choice(["", " ", "x"]) + body + rng.choice(["", " ", "!"])).encode()
    if kind == "random":
        return "".join(_any_codepoint(rng) for _ in range(rng.randint(1, 30))).encode()
    if kind == "mixed":
        return b"".join(_item(rng, rng.choice(KINDS[:-1])) + rng.choice([b"", b" ", b"\n"]) for _ in range(rng.randint(2, 5)))
    raise ValueError(kind)


KINDS = ["english", *SCRIPTS, "emoji", "code", "digits", "whitespace", "special", "invalid", "long", "random", "mixed"]


def generate(seed: int, n: int) -> list:
    """n strings (bytes), cycling through the kinds so each gets its share."""
    rng = random.Random(seed)
    fixed = [b"", b" ", b"\n", b"'s", b"'\xc5\xbfa", b"\xc2\x85", b"a\xcc\x81", b"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8"]
    return fixed + [_item(rng, KINDS[i % len(KINDS)]) for i in range(n - len(fixed))]


def benchmark_text(seed: int, n_bytes: int) -> str:
    """Mixed natural-ish text (valid UTF-8) of about n_bytes, for throughput measurements."""
    rng = random.Random(seed)
    weights = {"english": 12, "code": 4, "cjk": 2, "cyrillic": 1, "arabic": 1, "emoji": 1, "digits": 1, "whitespace": 1}
    kinds = [k for k, w in weights.items() for _ in range(w)]
    parts, size = [], 0
    while size < n_bytes:
        item = _item(rng, rng.choice(kinds)).decode("utf-8", "replace") + "\n"
        parts.append(item)
        size += len(item.encode())
    return "".join(parts)
