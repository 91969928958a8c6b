"""Seeded generator of ChatML training conversations for the tiny chat models (tools/train/).

Every conversation is a list of messages (plus, for tool use, a list of tool definitions) rendered
with the official Qwen3.5 chat template through tools/chat/hf_render.py, so the text is byte for byte
what transformers' apply_chat_template writes. Kinds of document:

  arithmetic   two- and three-digit addition and subtraction; thinking on (a digit-by-digit working
               in <think>) or off (the empty `<think>\\n\\n</think>\\n\\n` block, as the generation
               prompt writes it when thinking is off)
  tools        tool definitions in the system turn, a request, a tool call in the official XML
               format, often the tool response and the final answer
  prose        questions about Python standard-library functions and classes answered with their
               docstrings (PSF licence, read from the running Python; see DOCS_PYTHON below), and
               short stories from a small grammar written here
  dialogue     multi-turn chats mixing greetings, identity questions, arithmetic and prose
  raw          plain documentation text without any chat wrapper (for perplexity on plain text)
  copy         (copy mix only) a request to repeat a novel string, answered with the string

Mixes (MIXES): "base", the from-scratch training mix; "copy", a copy-heavy mix for a second stage of
training (tool calls whose argument values are mostly novel strings from the whole vocabulary); "novel",
the same with every tool argument novel (a refuted third stage); "phrase", the third stage kept: novel
arguments are half everyday English (phrases of common words, function words too, names), half as in
"copy".

Held out, and never generated for training (eval_sets()):
  - 200 two-digit pairs (A, B): "What is A + B?" (both orders are excluded from every training
    document, in any phrasing or operation);
  - tool-call cases whose argument values (cities, symbols, names, queries) come from word lists
    reserved for evaluation, and a second such set reserved for validation (choosing checkpoints);
  - docstrings whose qualified name hashes into the held-out bucket (prose perplexity, MTP).

Deterministic for a given seed and Python version (the docstrings are read from the running
interpreter's standard library; the version is recorded in the corpus manifest).
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import random
import re
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "chat"))

import dialects  # noqa: E402
import hf_render  # noqa: E402

SEED = 20261201
N_HELDOUT_PAIRS = 200
N_HELDOUT_TOOL_CASES = 100

SPECIAL_TEXTS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
                 "<tool_response>", "</tool_response>", "<think>", "</think>"]


_TEMPLATE: str | None = None


def template() -> str:
    global _TEMPLATE
    if _TEMPLATE is None:
        _TEMPLATE = dialects.find_official_template().read_text(encoding="utf-8")
    return _TEMPLATE


def render(messages, tools=None, add_generation_prompt=False, enable_thinking=True) -> str:
    kwargs = {} if enable_thinking else {"enable_thinking": False}
    return hf_render.render(template(), messages, tools=tools, add_generation_prompt=add_generation_prompt,
                            **kwargs)


def _h(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


# ----------------------------------------------------------------------------------------------
# Arithmetic

def heldout_pairs() -> list[tuple[int, int]]:
    """The 200 evaluation pairs (A, B), both two-digit, distinct as unordered pairs."""
    rng = random.Random(SEED + 1)
    seen, out = set(), []
    while len(out) < N_HELDOUT_PAIRS:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if (a, b) in seen or (b, a) in seen:
            continue
        seen.add((a, b))
        out.append((a, b))
    return out


_HELDOUT = {p for a, b in heldout_pairs() for p in ((a, b), (b, a))}
PLACES = ["ones", "tens", "hundreds", "thousands"]


def _digits(n: int) -> list[int]:
    return [int(c) for c in reversed(str(n))]


def add_working(a: int, b: int) -> str:
    da, db = _digits(a), _digits(b)
    lines, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = da[i] if i < len(da) else 0
        y = db[i] if i < len(db) else 0
        s = x + y + carry
        expr = f"{x} + {y}" + (f" + {carry}" if carry else "")
        place = PLACES[i].capitalize()
        if s >= 10:
            lines.append(f"{place}: {expr} = {s}, write {s - 10}, carry 1.")
        else:
            lines.append(f"{place}: {expr} = {s}, write {s}.")
        carry = s // 10
    if carry:
        lines.append(f"{PLACES[max(len(da), len(db))].capitalize()}: write the carry 1.")
    lines.append(f"So {a} + {b} = {a + b}.")
    return "\n".join(lines)


def sub_working(a: int, b: int) -> str:
    assert a >= b
    da, db = _digits(a), _digits(b)
    lines, borrow = [], 0
    for i in range(len(da)):
        x = da[i] - borrow
        y = db[i] if i < len(db) else 0
        place = PLACES[i].capitalize()
        head = f"{da[i]} - {borrow}" if borrow else f"{da[i]}"
        if x < y:
            lines.append(f"{place}: {head} is less than {y}, borrow 1: {x + 10} - {y} = {x + 10 - y}.")
            borrow = 1
        else:
            lines.append(f"{place}: {head} - {y} = {x - y}.")
            borrow = 0
    lines.append(f"So {a} - {b} = {a - b}.")
    return "\n".join(lines)


ADD_QUESTIONS = [("What is {a} + {b}?", 12), ("What is {a} plus {b}?", 1), ("Compute {a} + {b}.", 1),
                 ("{a} + {b} = ?", 1), ("Add {a} and {b}.", 1), ("Calculate {a} + {b}.", 1),
                 ("How much is {a} + {b}?", 1), ("what is {a}+{b}", 1)]
SUB_QUESTIONS = [("What is {a} - {b}?", 8), ("What is {a} minus {b}?", 1), ("Compute {a} - {b}.", 1),
                 ("{a} - {b} = ?", 1), ("Subtract {b} from {a}.", 1), ("Calculate {a} - {b}.", 1)]


def _pick(rng: random.Random, weighted):
    total = sum(w for _, w in weighted)
    r = rng.uniform(0, total)
    for item, w in weighted:
        r -= w
        if r <= 0:
            return item
    return weighted[-1][0]


def _operands(rng: random.Random) -> tuple[str, int, int]:
    while True:
        r = rng.random()
        if r < 0.50:
            op, a, b = "+", rng.randint(10, 99), rng.randint(10, 99)
        elif r < 0.70:
            op, a, b = "+", rng.randint(100, 999), rng.randint(10, 999)
            if rng.random() < 0.5:
                a, b = b, a
        elif r < 0.75:
            op, a, b = "+", rng.randint(0, 9), rng.randint(0, 99)
            if rng.random() < 0.5:
                a, b = b, a
        elif r < 0.88:
            op, a, b = "-", rng.randint(10, 99), rng.randint(10, 99)
        else:
            op, a, b = "-", rng.randint(100, 999), rng.randint(10, 999)
        if op == "-" and a < b:
            a, b = b, a
        if (a, b) in _HELDOUT:
            continue
        return op, a, b


def arithmetic_turn(rng: random.Random) -> tuple[str, str, str]:
    """(question, working, answer) for one fresh training problem."""
    op, a, b = _operands(rng)
    if op == "+":
        q = _pick(rng, ADD_QUESTIONS).format(a=a, b=b)
        return q, add_working(a, b), f"{a} + {b} = {a + b}."
    q = _pick(rng, SUB_QUESTIONS).format(a=a, b=b)
    return q, sub_working(a, b), f"{a} - {b} = {a - b}."


def arithmetic_doc(rng: random.Random, thinking: bool) -> dict:
    q, work, ans = arithmetic_turn(rng)
    msgs = _maybe_system(rng, [])
    msgs += [{"role": "user", "content": q},
             {"role": "assistant", "content": ans, "reasoning_content": work if thinking else ""}]
    return {"messages": msgs}


# ----------------------------------------------------------------------------------------------
# Tools

def _fn(name, description, props, required):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required}}}


TOOL_DEFS = {
    "get_weather": _fn("get_weather", "Get the current weather in a city.", {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    "calculator": _fn("calculator", "Evaluate an arithmetic expression.", {
        "expression": {"type": "string", "description": "The expression, e.g. 12 * 7"}}, ["expression"]),
    "web_search": _fn("web_search", "Search the web and return the top results.", {
        "query": {"type": "string"}}, ["query"]),
    "get_time": _fn("get_time", "Get the local time in a city.", {
        "city": {"type": "string"}}, ["city"]),
    "convert_currency": _fn("convert_currency", "Convert an amount of money between currencies.", {
        "amount": {"type": "number"}, "from_currency": {"type": "string"},
        "to_currency": {"type": "string"}}, ["amount", "from_currency", "to_currency"]),
    "get_stock_price": _fn("get_stock_price", "Get the latest price of a stock.", {
        "symbol": {"type": "string", "description": "Ticker symbol"}}, ["symbol"]),
    "send_email": _fn("send_email", "Send a short email.", {
        "to": {"type": "string"}, "subject": {"type": "string"}}, ["to", "subject"]),
    "translate": _fn("translate", "Translate text into another language.", {
        "text": {"type": "string"}, "target_language": {"type": "string"}}, ["text", "target_language"]),
}

CITIES = """Paris London Berlin Madrid Rome Vienna Prague Warsaw Lisbon Dublin Oslo Stockholm Helsinki
Copenhagen Amsterdam Brussels Zurich Geneva Munich Hamburg Milan Naples Athens Istanbul Cairo Nairobi Lagos
Accra Dakar Casablanca Tunis Johannesburg Tokyo Osaka Kyoto Seoul Busan Beijing Shanghai Shenzhen Taipei
Hanoi Bangkok Manila Jakarta Singapore Delhi Mumbai Chennai Kolkata Karachi Lahore Dhaka Tehran Baghdad Dubai
Doha Riyadh Sydney Melbourne Brisbane Perth Auckland Wellington Toronto Montreal Vancouver Chicago Boston Denver
Seattle Houston Dallas Miami Atlanta Phoenix Portland Austin Detroit Mexico Lima Bogota Quito Santiago
Caracas Havana Reykjavik Tallinn Riga Vilnius Kyiv Minsk Bucharest Sofia Belgrade Zagreb Budapest Krakow Porto
Seville Valencia Lyon Marseille Nice Bordeaux Toulouse Glasgow Edinburgh Cardiff Belfast Bristol Leeds
Liverpool Manchester Oxford Cambridge Geneva Bern Basel Salzburg Graz Bologna Florence Venice Turin Genoa""".split()
HELDOUT_CITIES = """Nantes Dresden Leipzig Utrecht Gdansk Bergen Malmo Tampere Aarhus Antwerp Lausanne Verona
Palermo Granada Bilbao Coimbra Galway Aberdeen Kaunas Tartu Split Varna Cluj Brno Linz Kobe Nagoya Incheon
Chengdu Hue Cebu Pune Agra Sapporo Hobart Calgary Ottawa Tucson Omaha Memphis""".split()
SYLLABLES = "ka lo mi ren dor va sel tan bri qua mor fen zu pal rin go shi ter ul an ost vik lan del".split()

CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "CNY", "INR", "SEK", "NOK", "DKK", "PLN", "BRL",
              "MXN", "KRW", "SGD", "NZD", "ZAR", "TRY"]
HELDOUT_CURRENCIES = ["HKD", "CZK", "HUF", "THB"]
STOCKS = ["AAPL", "MSFT", "GOOG", "AMZN", "TSLA", "NVDA", "META", "IBM", "INTC", "AMD", "ORCL", "NFLX", "ADBE",
          "CSCO", "PEP", "KO", "DIS", "NKE", "SBUX", "QCOM", "TXN", "SAP", "SONY", "BABA", "UBER", "SHOP"]
HELDOUT_STOCKS = ["ASML", "ABNB", "PYPL", "CRM", "SNOW", "ZM"]
PEOPLE = """anna ben carla dan eva finn gina hugo iris jack kate leo mia nick olga paul rosa sam tina umar vera
will xena yusuf zoe maria omar lena ivan noah emma""".split()
HELDOUT_PEOPLE = ["petra", "quentin", "soren", "ingrid", "marco", "fatima"]
DOMAINS = ["example.com", "mail.org", "work.net"]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Japanese", "Chinese", "Dutch", "Polish", "Swedish",
             "Korean", "Greek", "Turkish"]
HELDOUT_LANGUAGES = ["Finnish", "Czech", "Danish"]
TOPICS = """rust async runtimes; python list comprehension; history of the printing press; how rainbows form;
best hiking trails; quantum computing basics; chess openings; sourdough bread recipe; electric cars range;
the tallest mountains; solar panel efficiency; how vaccines work; jazz music history; learning to swim;
coffee brewing methods; the moon landing; machine learning courses; linux kernel scheduler; tea ceremony;
volcano eruptions; bird migration; deep sea creatures; ancient rome roads; origami cranes; bicycle repair;
gpu memory bandwidth; cloud storage prices; knitting patterns; marathon training; vegetable garden tips""".split(";")
HELDOUT_TOPICS = ["glacier formation", "violin making", "tide pools", "paper recycling", "desert plants"]
PHRASES = ["good morning", "thank you very much", "where is the station", "the food was great", "see you tomorrow",
           "how much does it cost", "i love this city", "the meeting is at noon", "happy birthday",
           "please close the door", "the weather is nice", "can you help me"]
HELDOUT_PHRASES = ["the train is late", "i lost my keys", "welcome home"]
SUBJECTS = ["meeting notes", "lunch plans", "project update", "weekly report", "travel dates", "budget review",
            "team dinner", "release schedule", "invoice", "holiday photos"]
HELDOUT_SUBJECTS = ["quarterly goals", "office move", "book club"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "clear", "stormy"]

# Validation values: reserved like the held-out ones (never a training argument) but only used to choose
# among checkpoints and training runs (quick_eval.py --tool-sets tools_valid), so that the held-out numbers
# of the chosen model are not biased by the choice.
VALID_CITIES = """Ghent Bruges Turku Bremen Kassel Rouen Lille Trieste Cordoba Cork Dundee Odense Uppsala Tromso
Poznan Lublin Pecs Iasi Plovdiv Nara Fukuoka Daegu Wuhan Davao Surat Darwin Halifax Regina Tulsa Boise""".split()
VALID_CURRENCIES = ["ILS", "RON", "ISK", "PHP"]
VALID_STOCKS = ["PINS", "SPOT", "DDOG", "ROKU", "ETSY", "LYFT"]
VALID_PEOPLE = ["greta", "tomas", "ines", "rafael", "yara", "henrik"]
VALID_LANGUAGES = ["Hungarian", "Portuguese", "Norwegian"]
VALID_TOPICS = ["river otters", "wind turbines", "medieval castles", "cheese making", "star maps"]
VALID_PHRASES = ["the bus is full", "we need more milk", "good night", "my phone is broken"]
VALID_SUBJECTS = ["garden party", "school trip", "annual leave"]
HELDOUT_VALUES = (HELDOUT_CITIES + HELDOUT_CURRENCIES + HELDOUT_STOCKS + HELDOUT_PEOPLE + HELDOUT_LANGUAGES
                  + HELDOUT_TOPICS + HELDOUT_PHRASES + HELDOUT_SUBJECTS)
VALID_VALUES = (VALID_CITIES + VALID_CURRENCIES + VALID_STOCKS + VALID_PEOPLE + VALID_LANGUAGES + VALID_TOPICS
                + VALID_PHRASES + VALID_SUBJECTS)


LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
WORDS = sorted(set(w for l in (["small", "brave", "quiet", "curious", "tired", "happy", "clever", "old",
                                           "young", "busy", "shy", "kind", "red", "green", "blue", "cold", "warm",
                                           "fast", "slow", "big", "new", "dark", "bright", "soft"],
                                ["cat", "dog", "fox", "owl", "rabbit", "horse", "duck", "bear", "goat", "mouse", "frog",
                                 "crow", "tree", "river", "house", "garden", "market", "train", "book", "lamp", "road",
                                 "bridge", "city", "window", "music", "paper", "stone", "cloud", "coffee", "bread",
                                 "boat", "letter", "clock", "door", "song", "shop", "island", "winter", "summer"],
                                ["history", "recipe", "guide", "tips", "review", "news", "prices", "rules", "maps",
                                 "plans", "notes", "ideas", "facts", "games", "tools", "photos"]) for w in l))


def _code(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(LETTERS) for _ in range(n))


def _made_up_word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))


def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) if rng.random() < 0.8 else _made_up_word(rng) for _ in range(rng.randint(lo, hi)))


# Novel values for the "copy" mix: strings spread over the whole vocabulary (pseudo-words built from
# English-like syllables, real words from the training docstrings, random letter runs, codes), so the
# model learns to copy whatever the user wrote rather than recall a value it has seen.
ONSETS = ("b c d f g h j k l m n p r s t v w z br bl ch cl cr dr fl fr gl gr kl pl pr sc sh sk sl sm sn sp st "
          "str sw th tr tw wh").split() + [""] * 4
NUCLEI = "a e i o u a e i o u ai ea ee ia io oa oo ou y".split()
CODAS = "n r s t l m d g k x ck ld nd ng nk nt rd rk rn rt sk st th".split() + [""] * 12


def _pseudo_word(rng: random.Random) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(CODAS)
                   for _ in range(rng.choice([1, 2, 2, 2, 3, 3, 4])))


_RESERVED_WORDS: set[str] | None = None


def reserved_words() -> set[str]:
    """Every word of every value reserved for evaluation, lowercased."""
    global _RESERVED_WORDS
    if _RESERVED_WORDS is None:
        _RESERVED_WORDS = {w.lower() for v in HELDOUT_VALUES for w in v.split()}
    return _RESERVED_WORDS


_VOCAB: list[str] | None = None


def vocabulary() -> list[str]:
    """Words of 3-14 letters from the training split of the docstrings and the stories' word lists,
    without any word of a reserved evaluation value."""
    global _VOCAB
    if _VOCAB is None:
        words = set(WORDS + ADJS + ANIMALS)
        for _, text in doc_split("train"):
            words.update(w.lower() for w in re.findall(r"[A-Za-z]{3,14}", text))
        _VOCAB = sorted(words - reserved_words())
    return _VOCAB


def _novel_word(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.4:
        w = _pseudo_word(rng)
    elif r < 0.8:
        w = rng.choice(vocabulary())
    elif r < 0.92:
        w = "".join(rng.choice(LETTERS.lower()) for _ in range(rng.randint(3, 9)))
    else:
        w = rng.choice(vocabulary()) + str(rng.randint(1, 999))
    return w if w.lower() not in reserved_words() else _novel_word(rng)


def _novel_name(rng: random.Random) -> str:
    """A place or language name: mostly Capitalised, sometimes two words, lower or upper case."""
    words = [_novel_word(rng) for _ in range(1 if rng.random() < 0.85 else 2)]
    r = rng.random()
    if r < 0.8:
        return " ".join(w.capitalize() for w in words)
    return " ".join(words) if r < 0.92 else " ".join(words).upper()


def _novel_code(rng: random.Random, lo: int, hi: int) -> str:
    code = "".join(rng.choice(LETTERS) for _ in range(rng.randint(lo, hi)))
    return code + str(rng.randint(1, 9)) if rng.random() < 0.05 else code


SHORT_WORDS = "a i my to in on of is at we it an no so up me he she our your his her its".split()


def _novel_phrase(rng: random.Random, lo: int, hi: int, short: bool = False) -> str:
    """Novel words; with `short`, 20% are short function words (phrases like "i lost my keys")."""
    return " ".join(rng.choice(SHORT_WORDS) if short and rng.random() < 0.2 else _novel_word(rng)
                    for _ in range(rng.randint(lo, hi)))


# English values for the "phrase" mix: everyday phrases, names and titles made of common English words
# (function words too), so that a multi-word argument of ordinary words is copied word for word rather
# than completed into a phrase the model knows. Only whole reserved values are excluded (a reserved
# phrase never appears as or inside a training argument); their single words are ordinary words here.
E_DETS = "the a my your our his her their this that some every no one".split()
E_PRONS = "i you we they he she it".split()
E_NOUNS = """train bus car bike plane ship ticket station airport road street bridge park garden house home room
kitchen door window key keys phone laptop bag box letter book club team office school shop market bank hotel
party dinner lunch breakfast coffee tea milk bread water cake soup meeting report plan budget trip holiday
weekend week month year morning evening night day birthday city village river lake sea beach mountain forest
dog cat bird horse friend family mother father sister brother teacher doctor boss neighbour child game song
film music picture photo map list note card gift money price bill job work project task move sale news story
question answer idea problem rain snow sun wind weather light clock watch shoe shirt coat hat umbrella""".split()
E_ADJS = """late early full empty broken new old open closed ready free busy quiet loud hot cold warm wet dry
clean dirty cheap expensive small big long short fast slow good bad nice great happy sad tired hungry lost
missing wrong right simple strange lucky safe dark bright fresh sweet red blue green yellow white black""".split()
E_VERBS = """need want like love have lost found left missed bought sold forgot booked cancelled finished started
opened closed fixed broke called sent took made saw heard moved paid""".split()
E_IMPER = """close open bring call send take make find keep check book cancel fix clean pay move wait stop start
read write buy sell order share""".split()
E_INTERJ = "welcome good hello thanks happy sorry see goodbye please merry".split()
E_ADVS = """home back now soon today tomorrow tonight later again here there inside outside early late please
twice too""".split()
E_MORE = "more less some many few two three ten enough".split()
E_FIRST = """alice bob clara david elena felix hanna isaac julia karl laura martin nora oscar pia ruben sofia
theo ursula victor wanda xavier yvonne zara adam beth chris diana edgar flora george helen""".split()


def _e_noun(rng: random.Random) -> str:
    return rng.choice(E_NOUNS)


def _english_phrase(rng: random.Random, lo: int = 1, hi: int = 6) -> str:
    """An everyday English phrase (some grammatical, some a bag of common words) of lo..hi words."""
    while True:
        r = rng.random()
        if r < 0.15:
            v = f"{rng.choice(E_DETS)} {_e_noun(rng)} is {rng.choice(E_ADJS)}"
        elif r < 0.3:
            v = f"{rng.choice(E_PRONS)} {rng.choice(E_VERBS)} {rng.choice(E_DETS)} {_e_noun(rng)}"
        elif r < 0.4:
            v = f"{rng.choice(E_PRONS)} {rng.choice(E_VERBS)} {rng.choice(E_MORE)} {_e_noun(rng)}"
        elif r < 0.5:
            v = f"{rng.choice(['please ', ''])}{rng.choice(E_IMPER)} {rng.choice(E_DETS)} {_e_noun(rng)}"
        elif r < 0.62:
            v = f"{rng.choice(E_INTERJ)} {rng.choice(E_ADVS + E_NOUNS)}"
        elif r < 0.77:
            v = f"{rng.choice(E_ADJS + E_NOUNS)} {_e_noun(rng)}"
        else:
            pool = (E_DETS, E_PRONS, E_NOUNS, E_NOUNS, E_ADJS, E_VERBS, E_ADVS)
            v = " ".join(rng.choice(rng.choice(pool)) for _ in range(rng.randint(lo, hi)))
        n = len(v.split())
        if lo <= n <= hi and not _has_reserved(v):
            return v


_RESERVED_SETS: dict[bool, tuple[set[str], list[str]]] = {}


def _has_reserved(v: str, validation: bool = True) -> bool:
    """Whether v is, or holds as whole words, a value reserved for evaluation (or, with `validation`, for
    validation); case-insensitive."""
    if validation not in _RESERVED_SETS:
        vals = [x.lower() for x in HELDOUT_VALUES + (VALID_VALUES if validation else [])]
        _RESERVED_SETS[validation] = (set(vals), [f" {x} " for x in vals if " " in x])
    whole, phrases = _RESERVED_SETS[validation]
    low = v.lower()
    return low in whole or any(x in f" {low} " for x in phrases)


def _english_name(rng: random.Random) -> str:
    """A place-like name: a capitalised English word or two ("Green Harbour"), or a pseudo-word."""
    r = rng.random()
    if r < 0.4:
        v = " ".join(w.capitalize() for w in [rng.choice(E_ADJS + E_NOUNS), _e_noun(rng)][: rng.choice([1, 2])])
    elif r < 0.7:
        v = _pseudo_word(rng).capitalize()
    else:
        v = rng.choice(E_FIRST).capitalize() + rng.choice(["", "", "ton", "ville", "burg", "field", "port"])
    return v if not _has_reserved(v) else _english_name(rng)


def _english_language(rng: random.Random) -> str:
    v = _pseudo_word(rng).capitalize() + rng.choice(["ish", "ese", "ian", "ic", "i", ""])
    return v if not _has_reserved(v) else _english_language(rng)


def _english_person(rng: random.Random) -> str:
    v = rng.choice(E_FIRST) if rng.random() < 0.6 else _pseudo_word(rng)
    return v if not _has_reserved(v) else _english_person(rng)


class ToolValues:
    """Argument values for one split: 'train', 'copy', 'novel', 'phrase', 'eval' or 'valid'. Evaluation
    ('eval') and checkpoint choice ('valid') draw from word lists reserved for them (never used in
    training). 'train' (the base mix) mixes fixed lists with made-up values from a small syllable set;
    'copy' (the copy mix) draws 85% novel values from the whole vocabulary (see _novel_word), 'novel' (the
    novel mix) all of them, with short function words in phrases; 'phrase' (the phrase mix) draws 45%
    English values of common words (see _english_phrase; codes, which have no English form, novel
    instead), 30% novel ones and 25% as 'train' does, so the model learns to copy arguments from the
    request rather than recall them."""

    def __init__(self, split: str):
        self.split = split
        self.ev = split in ("eval", "valid")
        self.copy = split in ("copy", "novel")
        self.novel = split == "novel"
        self.english = split == "phrase"
        self.reserved = set(HELDOUT_VALUES)

    def _pick(self, rng, held, valid, train, made_up, novel, english=None):
        if self.ev:
            return rng.choice(held if self.split == "eval" else valid)
        while True:
            if self.english:
                r = rng.random()
                v = (english(rng) if r < 0.45 and english else novel(rng) if r < 0.75
                     else made_up(rng) if r < 0.875 else rng.choice(train))
                if _has_reserved(v):
                    continue
            elif self.novel:
                v = novel(rng)
            elif self.copy:
                v = novel(rng) if rng.random() < 0.85 else rng.choice(train)
            else:
                v = made_up(rng) if rng.random() < 0.5 else rng.choice(train)
            if v not in self.reserved:
                return v

    def city(self, rng):
        return self._pick(rng, HELDOUT_CITIES, VALID_CITIES, CITIES, lambda r: _made_up_word(r).capitalize(),
                          _novel_name, _english_name)

    def currency_pair(self, rng):
        if self.ev:
            held = HELDOUT_CURRENCIES if self.split == "eval" else VALID_CURRENCIES
            return rng.sample(held + CURRENCIES[:4], 2)
        a = self._pick(rng, [], [], CURRENCIES, lambda r: _code(r, 3), lambda r: _novel_code(r, 3, 3))
        b = a
        while b == a:
            b = self._pick(rng, [], [], CURRENCIES, lambda r: _code(r, 3), lambda r: _novel_code(r, 3, 3))
        return [a, b]

    def stock(self, rng):
        return self._pick(rng, HELDOUT_STOCKS, VALID_STOCKS, STOCKS, lambda r: _code(r, r.randint(2, 5)),
                          lambda r: _novel_code(r, 2, 5))

    def person(self, rng):
        return self._pick(rng, HELDOUT_PEOPLE, VALID_PEOPLE, PEOPLE, _made_up_word,
                          lambda r: _novel_word(r).lower(), _english_person)

    def language(self, rng):
        return self._pick(rng, HELDOUT_LANGUAGES, VALID_LANGUAGES, LANGUAGES,
                          lambda r: _made_up_word(r).capitalize(), _novel_name, _english_language)

    def topic(self, rng):
        return self._pick(rng, HELDOUT_TOPICS, VALID_TOPICS, [t.strip() for t in TOPICS], lambda r: _words(r, 2, 4),
                          lambda r: _novel_phrase(r, 1, 4, self.novel), lambda r: _english_phrase(r, 1, 4))

    def phrase(self, rng):
        return self._pick(rng, HELDOUT_PHRASES, VALID_PHRASES, PHRASES, lambda r: _words(r, 2, 5),
                          lambda r: _novel_phrase(r, 1, 5, self.novel), lambda r: _english_phrase(r, 1, 6))

    def subject(self, rng):
        return self._pick(rng, HELDOUT_SUBJECTS, VALID_SUBJECTS, SUBJECTS, lambda r: _words(r, 1, 3),
                          lambda r: _novel_phrase(r, 1, 3, self.novel), lambda r: _english_phrase(r, 1, 3))


def _expression(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    while (a, b) in _HELDOUT:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice(["+", "-", "*"])
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return f"{a} {op} {b}", value


def tool_request(rng: random.Random, name: str, vals: ToolValues) -> dict:
    """A user request for tool `name`: {user, args, response, answer, why}."""
    if name == "get_weather":
        city = vals.city(rng)
        unit = rng.choice([None, None, "celsius", "fahrenheit"])
        q = rng.choice(["What's the weather in {c}?", "What is the weather like in {c} today?",
                        "How is the weather in {c}?", "Is it raining in {c}?", "Weather in {c}, please."])
        if unit:
            q = rng.choice(["What's the weather in {c} in {u}?", "Tell me the temperature in {c} in {u}."])
        args = {"city": city} | ({"unit": unit} if unit else {})
        t = rng.randint(-5, 35) if unit != "fahrenheit" else rng.randint(20, 95)
        cond = rng.choice(CONDITIONS)
        sym = "°F" if unit == "fahrenheit" else "°C"
        return {"user": q.format(c=city, u=unit), "args": args,
                "response": {"city": city, "temperature": t, "condition": cond},
                "answer": f"It is {t}{sym} and {cond} in {city}.",
                "why": f"The user wants the weather in {city}. I will call get_weather."}
    if name == "get_time":
        city = vals.city(rng)
        q = rng.choice(["What time is it in {c}?", "What's the local time in {c}?", "Tell me the time in {c}."])
        hh, mm = rng.randint(0, 23), rng.randint(0, 59)
        return {"user": q.format(c=city), "args": {"city": city},
                "response": {"city": city, "time": f"{hh:02d}:{mm:02d}"},
                "answer": f"It is {hh:02d}:{mm:02d} in {city}.",
                "why": f"The user asks for the time in {city}. I will call get_time."}
    if name == "calculator":
        expr, value = _expression(rng)
        q = rng.choice(["Use the calculator to compute {e}.", "Please calculate {e} with the calculator.",
                        "Can you evaluate {e}?", "I need the value of {e}."])
        return {"user": q.format(e=expr), "args": {"expression": expr}, "response": {"result": value},
                "answer": f"{expr} = {value}.",
                "why": f"The user wants {expr} evaluated. I will call calculator."}
    if name == "web_search":
        topic = vals.topic(rng)
        q = rng.choice(["Search the web for {t}.", "Find information about {t}.", "Look up {t} online.",
                        "Can you search for {t}?"])
        titles = [f"{topic.capitalize()} - {w}" for w in rng.sample(["Guide", "Wiki", "News", "Blog", "FAQ"], 2)]
        return {"user": q.format(t=topic), "args": {"query": topic}, "response": {"results": titles},
                "answer": f"I found: {titles[0]}; {titles[1]}.",
                "why": f"The user wants search results about {topic}. I will call web_search."}
    if name == "convert_currency":
        amount = rng.choice([rng.randint(1, 999), rng.randint(1, 99) * 10])
        f, t = vals.currency_pair(rng)
        q = rng.choice(["Convert {a} {f} to {t}.", "How much is {a} {f} in {t}?",
                        "What is {a} {f} in {t}?", "Please change {a} {f} into {t}."])
        res = round(amount * rng.uniform(0.2, 3.0), 2)
        return {"user": q.format(a=amount, f=f, t=t), "args": {"amount": amount, "from_currency": f, "to_currency": t},
                "response": {"amount": res, "currency": t}, "answer": f"{amount} {f} is about {res} {t}.",
                "why": f"The user wants to convert {amount} {f} to {t}. I will call convert_currency."}
    if name == "get_stock_price":
        s = vals.stock(rng)
        q = rng.choice(["What is the stock price of {s}?", "How much is {s} trading at?", "Get me the price of {s}.",
                        "Check the {s} share price."])
        p = round(rng.uniform(5, 900), 2)
        return {"user": q.format(s=s), "args": {"symbol": s}, "response": {"symbol": s, "price": p},
                "answer": f"{s} is trading at {p}.",
                "why": f"The user asks for the price of {s}. I will call get_stock_price."}
    if name == "send_email":
        to = f"{vals.person(rng)}@{rng.choice(DOMAINS)}"
        subj = vals.subject(rng)
        q = rng.choice(["Send an email to {to} with the subject {s}.", "Email {to} about {s}.",
                        "Please write to {to}, subject: {s}."])
        return {"user": q.format(to=to, s=subj), "args": {"to": to, "subject": subj}, "response": {"status": "sent"},
                "answer": f"The email about {subj} was sent to {to}.",
                "why": f"The user wants an email sent to {to}. I will call send_email."}
    if name == "translate":
        text, lang = vals.phrase(rng), vals.language(rng)
        q = rng.choice(["Translate \"{x}\" into {l}.", "How do you say \"{x}\" in {l}?", "Translate to {l}: {x}"])
        return {"user": q.format(x=text, l=lang), "args": {"text": text, "target_language": lang},
                "response": {"translation": f"[{lang}] {text}"}, "answer": f"In {lang}: [{lang}] {text}.",
                "why": f"The user wants \"{text}\" in {lang}. I will call translate."}
    raise KeyError(name)


def tool_case(rng: random.Random, vals: ToolValues) -> dict:
    """Tools offered (1-3, random order) and a request for one of them."""
    names = rng.sample(sorted(TOOL_DEFS), rng.choice([1, 2, 2, 3]))
    target = rng.choice(names)
    req = tool_request(rng, target, vals)
    return {"tools": [TOOL_DEFS[n] for n in names], "name": target, **req}


def tool_doc(rng: random.Random, thinking: bool, values: str = "train") -> dict:
    vals = ToolValues(values)
    case = tool_case(rng, vals)
    msgs = [{"role": "user", "content": case["user"]}]
    if rng.random() < 0.1:   # tools offered, but the request is plain arithmetic or chat
        q, work, ans = arithmetic_turn(rng) if rng.random() < 0.6 else (*_smalltalk(rng), )
        msgs = [{"role": "user", "content": q},
                {"role": "assistant", "content": ans, "reasoning_content": work if thinking else ""}]
        return {"messages": msgs, "tools": case["tools"]}
    call = {"type": "function", "function": {"name": case["name"], "arguments": case["args"]}}
    msgs.append({"role": "assistant", "content": "", "tool_calls": [call],
                 "reasoning_content": case["why"] if thinking else ""})
    if rng.random() < 0.75:
        msgs.append({"role": "tool", "content": json.dumps(case["response"], ensure_ascii=False)})
        msgs.append({"role": "assistant", "content": case["answer"],
                     "reasoning_content": "The tool returned the result. I will report it." if thinking else ""})
    return {"messages": msgs, "tools": case["tools"]}


# ----------------------------------------------------------------------------------------------
# Prose: Python standard-library docstrings, and stories

DOCS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
DOC_MODULES = """string textwrap json os.path collections itertools functools random math statistics datetime
calendar heapq bisect shutil pathlib re csv argparse logging subprocess threading queue socket email.message
http.client urllib.parse zipfile tarfile gzip hashlib base64 struct copy pprint enum dataclasses typing contextlib
abc io tempfile glob fnmatch difflib unittest doctest inspect ast tokenize decimal fractions numbers operator uuid
time sched sqlite3 html configparser getopt optparse locale gettext codecs unicodedata secrets hmac zlib lzma bz2
pickle shelve array weakref types graphlib ipaddress mimetypes smtplib ftplib wave colorsys asyncio
concurrent.futures multiprocessing selectors signal platform sysconfig traceback warnings timeit trace
filecmp fileinput linecache netrc plistlib quopri xml.etree.ElementTree xml.dom.minidom html.parser
http.server http.cookies urllib.request wsgiref.simple_server zipapp tomllib reprlib cmd shlex code codeop pdb bdb
dis pickletools py_compile compileall keyword token pkgutil modulefinder runpy""".split()


def _clean_doc(doc: str, limit: int = 700) -> str | None:
    doc = doc.strip()
    if len(doc) < 40 or any(s in doc for s in SPECIAL_TEXTS) or ">>>" in doc:
        return None
    paras = [p.strip() for p in re.split(r"\n\s*\n", doc) if p.strip()]
    out = ""
    for p in paras:
        if out and len(out) + len(p) > limit:
            break
        out = f"{out}\n\n{p}" if out else p
    return out[: limit * 2]


_DOCS: list[tuple[str, str]] | None = None


def docstrings() -> list[tuple[str, str]]:
    """(qualified name, cleaned docstring) of public stdlib functions, classes and methods, sorted."""
    global _DOCS
    if _DOCS is not None:
        return _DOCS
    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for modname in DOC_MODULES:
            try:
                mod = importlib.import_module(modname)
            except Exception:  # noqa: BLE001  (a module missing from this build of Python)
                continue
            for name, obj in inspect.getmembers(mod):
                if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                    continue
                if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                    continue
                items = [(f"{modname}.{name}", obj)]
                if inspect.isclass(obj):
                    for mname, m in vars(obj).items():
                        if not mname.startswith("_") and inspect.isfunction(m):
                            items.append((f"{modname}.{name}.{mname}", m))
                for qual, o in items:
                    d = o.__doc__
                    if isinstance(d, str):
                        d = _clean_doc(inspect.cleandoc(d))
                        if d:
                            found[qual] = d
    _DOCS = sorted(found.items())
    return _DOCS


def doc_is_heldout(qual: str) -> bool:
    return _h("heldout:" + qual) % 10 == 0


def doc_split(split: str) -> list[tuple[str, str]]:
    return [d for d in docstrings() if doc_is_heldout(d[0]) == (split == "eval")]


NAMES = ["Ada", "Ben", "Cleo", "Dev", "Ema", "Finn", "Gus", "Hana", "Ivo", "Juno", "Kai", "Lia", "Max", "Nia", "Otto"]
ANIMALS = ["cat", "dog", "fox", "owl", "rabbit", "horse", "duck", "bear", "goat", "mouse", "frog", "crow"]
PLACES_S = ["the forest", "the river", "the old mill", "the market", "the hill", "the harbour", "the library",
            "the garden", "the station", "the bakery", "the beach", "the farm"]
ADJS = ["small", "brave", "quiet", "curious", "tired", "happy", "clever", "old", "young", "busy", "shy", "kind"]
VERBS = ["walked to", "ran to", "looked for a friend at", "found a map near", "slept under a tree by",
         "sang a song at", "waited for the rain to stop at", "built a little house near", "lost a red hat at",
         "read a book at"]
ENDINGS = ["In the end, everyone went home happy.", "It was a good day.", "Then the sun went down.",
           "The next morning, it all began again.", "And that was the end of the adventure."]


def story(rng: random.Random) -> tuple[str, str]:
    name, animal = rng.choice(NAMES), rng.choice(ANIMALS)
    adj = rng.choice(ADJS)
    s = [f"Once there was a {adj} {animal} called {name}."]
    for _ in range(rng.randint(2, 4)):
        s.append(f"{rng.choice(['One day', 'Later', 'After lunch', 'At night', 'In the morning'])}, {name} "
                 f"{rng.choice(VERBS)} {rng.choice(PLACES_S)}.")
        if rng.random() < 0.4:
            s.append(f"There {name} met a {rng.choice(ADJS)} {rng.choice(ANIMALS)}.")
    s.append(rng.choice(ENDINGS))
    q = rng.choice([f"Tell me a short story about a {animal}.", f"Write a story about a {adj} {animal}.",
                    f"Can you tell me a story about {name} the {animal}?", "Tell me a bedtime story."])
    return q, " ".join(s)


def prose_doc(rng: random.Random, thinking: bool, docs: list[tuple[str, str]]) -> dict:
    if rng.random() < 0.5:
        q, text = story(rng)
        why = "The user wants a short story. I will write one."
    else:
        qual, text = rng.choice(docs)
        short = qual.rsplit(".", 1)[-1]
        q = rng.choice([f"What does {qual} do?", f"Explain {qual}.", f"Describe {qual} in Python.",
                        f"What is {short} in the {qual.split('.')[0]} module?", f"Tell me about {qual}."])
        why = f"The user asks about {qual}. I will describe it."
    msgs = _maybe_system(rng, [])
    msgs += [{"role": "user", "content": q},
             {"role": "assistant", "content": text, "reasoning_content": why if thinking else ""}]
    return {"messages": msgs}


def raw_doc(rng: random.Random, docs: list[tuple[str, str]]) -> dict:
    parts = []
    for _ in range(rng.randint(2, 5)):
        qual, text = rng.choice(docs)
        parts.append(f"{qual}\n\n{text}")
    return {"raw": "\n\n".join(parts) + "\n"}


# ----------------------------------------------------------------------------------------------
# Dialogue

SYSTEMS = ["You are a helpful assistant.", "You are a concise assistant.", "Answer briefly.",
           "You are a friendly math tutor.", "You are Qwen, a helpful assistant."]


def _maybe_system(rng: random.Random, msgs: list) -> list:
    if rng.random() < 0.12:
        return msgs + [{"role": "system", "content": rng.choice(SYSTEMS)}]
    return msgs


SMALLTALK = [
    (["Hi!", "Hello!", "Hey there.", "Good morning!"], ["Hello! How can I help you today?", "Hi! What can I do for you?"]),
    (["Who are you?", "What are you?", "What is your name?"],
     ["I am a tiny chat model with the Qwen3.5 architecture, trained for qwenrt. I can add and subtract numbers, "
      "call tools and tell short stories."]),
    (["Thanks!", "Thank you.", "Great, thanks."], ["You're welcome!", "Glad I could help."]),
    (["How are you?", "How are you doing?"], ["I'm doing well, thank you. How can I help?"]),
    (["Bye!", "Goodbye.", "See you later."], ["Goodbye! Have a nice day."]),
    (["What can you do?", "Help"], ["I can do two- and three-digit arithmetic, call tools such as a weather or "
                                    "search function, and tell short stories."]),
]


def _smalltalk(rng: random.Random) -> tuple[str, str, str]:
    qs, ans = rng.choice(SMALLTALK)
    return rng.choice(qs), "The user is chatting. I will reply politely.", rng.choice(ans)


def dialogue_doc(rng: random.Random, thinking: bool, docs) -> dict:
    msgs = _maybe_system(rng, [])
    n = rng.randint(2, 4)
    for i in range(n):
        r = rng.random()
        if r < 0.35:
            q, work, ans = _smalltalk(rng)
        elif r < 0.8:
            q, work, ans = arithmetic_turn(rng)
        else:
            d = prose_doc(rng, True, docs)["messages"][-2:]
            q, work, ans = d[0]["content"], d[1]["reasoning_content"], d[1]["content"]
        msgs += [{"role": "user", "content": q},
                 {"role": "assistant", "content": ans, "reasoning_content": work if thinking else ""}]
    return {"messages": msgs}


# ----------------------------------------------------------------------------------------------
# Corpus

COPY_REQUESTS = ["Repeat after me: {v}", "Say exactly this: {v}", "Please repeat \"{v}\".", "Echo this back: {v}",
                 "Write {v} back to me.", "Can you repeat {v}?", "Copy this text: {v}"]


def copy_doc(rng: random.Random, thinking: bool, english: bool = False) -> dict:
    """A request to repeat a novel string (names, codes, words from the whole vocabulary; with `english`
    half of them everyday English phrases), answered by the string itself: plain copying practice."""
    r = rng.random()
    if english and rng.random() < 0.5:
        v = _english_phrase(rng, 1, 7)
    else:
        v = (_novel_phrase(rng, 1, 6) if r < 0.5 else _novel_name(rng) if r < 0.8
             else " ".join(_novel_code(rng, 2, 6) for _ in range(rng.randint(1, 3))))
    msgs = _maybe_system(rng, [])
    msgs += [{"role": "user", "content": rng.choice(COPY_REQUESTS).format(v=v)},
             {"role": "assistant", "content": v,
              "reasoning_content": f"The user wants me to repeat \"{v}\"." if thinking else ""}]
    return {"messages": msgs}


# The base mix trains from scratch; the copy and novel mixes continue training on copy-heavy data (tool
# calls with novel argument values, repetition requests) with enough of the rest to keep it.
MIXES = {
    "base": [("arithmetic", 45), ("tools", 15), ("prose", 18), ("dialogue", 15), ("raw", 5)],
    "copy": [("arithmetic", 45), ("tools", 30), ("copy", 8), ("prose", 7), ("dialogue", 8), ("raw", 2)],
    "novel": [("arithmetic", 45), ("tools", 30), ("copy", 8), ("prose", 7), ("dialogue", 8), ("raw", 2)],
    "phrase": [("arithmetic", 45), ("tools", 30), ("copy", 8), ("prose", 7), ("dialogue", 8), ("raw", 2)],
}


def document(rng: random.Random, docs, mix: str = "base") -> tuple[str, str]:
    """(kind, text) of one training document."""
    kind = _pick(rng, MIXES[mix])
    thinking = rng.random() < 0.5
    if kind == "arithmetic":
        d = arithmetic_doc(rng, thinking)
    elif kind == "tools":
        d = tool_doc(rng, thinking, mix if mix in ("copy", "novel", "phrase") else "train")
    elif kind == "copy":
        d = copy_doc(rng, thinking, english=mix == "phrase")
    elif kind == "prose":
        d = prose_doc(rng, thinking, docs)
    elif kind == "dialogue":
        d = dialogue_doc(rng, thinking, docs)
    else:
        return kind, raw_doc(rng, docs)["raw"]
    return kind, render(d["messages"], tools=d.get("tools"))


def generate(seed: int, n_docs: int, docs_split: str = "train", mix: str = "base"):
    """Yield (kind, text) for n_docs training documents; identical for identical arguments.
    docs_split="eval" draws the docstrings from the held-out split (for held-out text)."""
    rng = random.Random(seed)
    docs = doc_split(docs_split)
    for _ in range(n_docs):
        yield document(rng, docs, mix)


def eval_sets() -> dict:
    """Everything the evaluation uses; nothing here appears in training documents."""
    def tool_cases(seed: int, split: str) -> list[dict]:
        rng, vals = random.Random(seed), ToolValues(split)
        cases = [tool_case(rng, vals) for _ in range(N_HELDOUT_TOOL_CASES)]
        return [{"tools": c["tools"], "user": c["user"], "name": c["name"], "arguments": c["args"],
                 "reasoning": c["why"]} for c in cases]
    tools = tool_cases(SEED + 2, "eval")
    # The same with the validation values (for choosing checkpoints; quick_eval.py --tool-sets tools_valid).
    tools_valid = tool_cases(SEED + 6, "valid")
    # The same, with argument values drawn as training draws them (list values or fresh made-up ones):
    # new cases, not new values.
    tools_train_values = tool_cases(SEED + 4, "train")
    held = doc_split("eval")
    prose_text = "\n\n".join(f"{q}\n\n{t}" for q, t in held) + "\n"
    prose_chats = []
    for qual, text in held:
        msgs = [{"role": "user", "content": f"What does {qual} do?"},
                {"role": "assistant", "content": text, "reasoning_content": ""}]
        prose_chats.append(render(msgs))
    # In-distribution held-out text: documents of every kind from another seed, docstrings from the
    # held-out split (short arithmetic documents may repeat a training document word for word).
    chat_text = "".join(t for _, t in generate(SEED + 3, 150, docs_split="eval"))
    # Plain text without control tokens (qwenrt perplexity does not parse them): generated stories.
    srng = random.Random(SEED + 5)
    story_text = "\n\n".join(story(srng)[1] for _ in range(120)) + "\n"
    return {"chat_text": chat_text, "story_text": story_text, "tools_train_values": tools_train_values,
            "tools_valid": tools_valid,
            "arithmetic": [{"a": a, "b": b, "prompt": f"What is {a} + {b}?", "answer": a + b}
                           for a, b in heldout_pairs()],
            "tools": tools, "prose_text": prose_text, "prose_chats": prose_chats}


# Mixes generated before the validation values existed: their tool arguments may hold a validation value
# by chance (random codes such as "ILS" did), so only the held-out values are checked for them.
MIXES_BEFORE_VALIDATION = ("base", "copy", "novel")


def check_heldout(texts, validation: bool = True) -> None:
    """Assert that no held-out pair appears as 'A + B' / 'A - B' / 'A+B' in the given texts, and that no
    tool-call argument (or the name before an e-mail's @) is, or holds, a value reserved for evaluation or
    (with `validation`) for validation."""
    bad = set()
    pat = re.compile(r"(?<![\d.])(\d+)(?: [-+] |\+)(\d+)(?![\d.])")
    param = re.compile(r"<parameter=[^>\n]+>\n(.*?)\n</parameter>", re.S)
    for t in texts:
        for m in pat.finditer(t):
            if (int(m.group(1)), int(m.group(2))) in _HELDOUT:
                bad.add(m.group(0))
        for m in param.finditer(t):
            if any(_has_reserved(v, validation) for v in (m.group(1), m.group(1).split("@")[0])):
                bad.add(m.group(1))
    if bad:
        raise AssertionError(f"held-out values in training text: {sorted(bad)[:10]}")


if __name__ == "__main__":
    import collections
    kinds = collections.Counter()
    for i, (k, t) in enumerate(generate(SEED, 12)):
        kinds[k] += 1
        print(f"----- {k}\n{t}")
    print(kinds, len(docstrings()), len(doc_split("eval")))
