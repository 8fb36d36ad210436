"""The web shop's data: a procedural catalogue, tasks (goals) by id, search, and the reward.

Everything is a pure function of ``(num_products, seed)`` and the task id: no files, no network,
no hash randomisation (``random.Random`` seeded with ints or strings is stable across runs).

    cat = catalogue(300, seed=0)           # cached; 300 products in 9 categories
    goal = cat.goal(task_id)               # Goal(pid, attributes, colour, size, max_price, instruction)
    cat.search("red cotton t-shirt")       # products, best match first
    cat.reward(goal, pid, colour, size)    # WebShop-style match fraction, 1.0 for the goal product

Tasks: ``VARIANTS`` goals per product, ``task_id = pid * VARIANTS + variant``. Splits go by
product (``pid % 10``: 9 test, 8 dev, the rest train), so no test goal names a product that a
training goal names.

Reward (after WebShop, Yao et al. 2022, simplified to crisp attributes): a product of another
category scores 0; otherwise the fraction of the goal's attributes (material, maybe a feature),
options (colour, size) and price bound (strictly under) that the bought item meets. The goal's
own product with the goal's options meets all of them (1.0); so does any other product that
happens to meet every constraint, as in WebShop.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

VARIANTS = 8
"""Goals per product: task ids ``pid * VARIANTS .. pid * VARIANTS + VARIANTS - 1``."""

SPLITS = ("train", "dev", "test")

COLOURS = (
    "black",
    "white",
    "grey",
    "navy",
    "blue",
    "red",
    "green",
    "yellow",
    "orange",
    "pink",
    "purple",
    "brown",
    "beige",
)
BRANDS = (
    "Alder",
    "Brightline",
    "Cobalt",
    "Driftwood",
    "Elmhurst",
    "Fable",
    "Granite",
    "Harbor",
    "Juniper",
    "Kestrel",
    "Lumen",
    "Northwind",
)

_CLOTHES = ("XS", "S", "M", "L", "XL", "XXL")
_PAIRS = ("jeans", "sneakers", "socks")  # plural nouns: "a pair of"


@dataclass(frozen=True)
class Category:
    name: str
    plural: str
    sizes: tuple[str, ...]
    dollars: tuple[int, int]  # price range
    materials: tuple[str, ...]
    features: tuple[str, ...]


# Kept packed by hand (not formatted): a category to two lines, not a field a line.
CATEGORIES = (
    Category("t-shirt", "t-shirts", _CLOTHES, (9, 39), ("cotton", "linen", "polyester", "bamboo"),
             ("slim fit", "crew neck", "v-neck", "long sleeve", "oversized")),
    Category("hoodie", "hoodies", _CLOTHES, (25, 79), ("cotton", "fleece", "polyester", "wool"),
             ("zip-up", "pullover", "lightweight", "oversized")),
    Category("jeans", "jeans", ("28", "30", "32", "34", "36", "38"), (29, 99), ("denim", "cotton", "hemp"),
             ("slim fit", "straight leg", "relaxed fit", "high waist")),
    Category("sneakers", "sneakers", ("6", "7", "8", "9", "10", "11", "12"), (35, 129),
             ("canvas", "leather", "mesh", "suede"), ("waterproof", "lightweight", "high-top", "slip-on")),
    Category("jacket", "jackets", _CLOTHES, (49, 199), ("nylon", "wool", "leather", "polyester"),
             ("waterproof", "insulated", "packable", "windproof")),
    Category("socks", "socks", ("S", "M", "L"), (5, 19), ("wool", "cotton", "bamboo"),
             ("ankle", "cushioned", "knee-high", "breathable")),
    Category("backpack", "backpacks", ("15 L", "20 L", "25 L", "30 L"), (29, 149),
             ("nylon", "canvas", "polyester", "leather"), ("waterproof", "rolltop", "laptop sleeve", "lightweight")),
    Category("dress", "dresses", ("XS", "S", "M", "L", "XL"), (29, 119), ("linen", "cotton", "silk", "polyester"),
             ("maxi", "wrap", "sleeveless", "midi")),
    Category("cap", "caps", ("S/M", "L/XL"), (9, 35), ("cotton", "wool", "polyester"),
             ("adjustable", "mesh back", "waterproof", "flat brim")),
)  # fmt: skip
CATEGORY = {c.name: c for c in CATEGORIES}


@dataclass(frozen=True)
class Product:
    pid: int
    name: str
    category: str
    brand: str
    material: str
    features: tuple[str, ...]
    colours: tuple[str, ...]
    sizes: tuple[str, ...]
    price_cents: int
    rating: int  # stars, 1..5
    description: str

    @property
    def price(self) -> str:
        return dollars(self.price_cents)

    @property
    def attributes(self) -> frozenset[str]:
        return frozenset((self.material, *self.features))


@dataclass(frozen=True)
class Goal:
    task_id: int
    pid: int
    category: str
    attributes: tuple[str, ...]  # material, then maybe one feature
    colour: str
    size: str
    max_price_cents: int  # strictly under
    instruction: str


def dollars(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


_WORD = re.compile(r"[a-z0-9]+(?:[-/][a-z0-9]+)*")


def _stem(word: str) -> str:
    # Plural "s" only; the same rule on both sides is all a keyword match needs.
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def words(text: str) -> list[str]:
    """Search tokens of ``text``: lower case, hyphenated words kept whole, plural s dropped."""
    return [_stem(w) for w in _WORD.findall(text.lower())]


def _one(category: str, words_before: str) -> str:
    """ "a red cotton t-shirt", "an orange cap", "a pair of blue jeans"."""
    if category in _PAIRS:
        return f"a pair of {words_before} {category}"
    return f"{'an' if words_before[0] in 'aeiou' else 'a'} {words_before} {category}"


class Catalogue:
    """``num_products`` products made from ``seed``; use ``catalogue()`` to share one per process."""

    def __init__(self, num_products: int = 300, seed: int = 0) -> None:
        for key, value in (("num_products", num_products), ("seed", seed)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"webshop: option {key} must be an integer, got {value!r}")
        if not 20 <= num_products <= 1000:
            # Below 20 some category would have no product; above 1000 names start to repeat.
            raise ValueError(f"webshop: num_products must be within 20..1000, got {num_products}")
        self.num_products, self.seed = num_products, seed
        self.products = self._make(num_products, random.Random(seed))
        self._name_words = [set(words(p.name)) for p in self.products]
        self._all_words = [
            set(
                words(
                    " ".join(
                        (
                            p.name,
                            p.category,
                            CATEGORY[p.category].plural,
                            p.brand,
                            p.material,
                            *p.features,
                            *p.colours,
                            p.description,
                        )
                    )
                )
            )
            for p in self.products
        ]

    @staticmethod
    def _make(n: int, rng: random.Random) -> tuple[Product, ...]:
        products: list[Product] = []
        names: set[str] = set()
        while len(products) < n:
            # Categories in turn, so every category has about n/9 products.
            cat = CATEGORIES[len(products) % len(CATEGORIES)]
            brand, material = rng.choice(BRANDS), rng.choice(cat.materials)
            features = rng.sample(cat.features, rng.choice((1, 1, 2)))
            name = f"{brand} {features[0]} {material} {cat.name}"
            if name in names:
                continue
            names.add(name)
            picked = set(rng.sample(COLOURS, rng.randint(2, 5)))
            colours = tuple(c for c in COLOURS if c in picked)  # palette order
            lo = rng.randrange(len(cat.sizes) - 1)
            hi = rng.randint(lo + 2, len(cat.sizes))
            cents = rng.randint(*cat.dollars) * 100 + rng.choice((0, 49, 99))
            feats = " and ".join(features)
            description = (
                f"{_one(cat.name, feats).capitalize()} by {brand}, made of {material}. "
                f"Available in {len(colours)} colours and sizes {cat.sizes[lo]} to {cat.sizes[hi - 1]}."
            )
            products.append(
                Product(
                    len(products),
                    name,
                    cat.name,
                    brand,
                    material,
                    tuple(features),
                    colours,
                    cat.sizes[lo:hi],
                    cents,
                    rng.randint(2, 5),
                    description,
                )
            )
        return tuple(products)

    # ------------------------------------------------------------ tasks

    @property
    def num_tasks(self) -> int:
        return self.num_products * VARIANTS

    def task_ids(self, split: str) -> list[int]:
        if split not in SPLITS:
            raise ValueError(f"webshop: unknown split {split!r}; splits are {list(SPLITS)}")
        want = {"test": {9}, "dev": {8}, "train": set(range(8))}[split]
        return [t for t in range(self.num_tasks) if (t // VARIANTS) % 10 in want]

    def goal(self, task_id: int) -> Goal:
        if not isinstance(task_id, int) or not 0 <= task_id < self.num_tasks:
            raise ValueError(
                f"webshop: task id {task_id!r} is out of range 0..{self.num_tasks - 1} "
                f"(num_products={self.num_products}, {VARIANTS} tasks per product)"
            )
        p = self.products[task_id // VARIANTS]
        cat = CATEGORY[p.category]
        rng = random.Random(f"webshop goal {self.seed} {task_id}")
        attributes: tuple[str, ...] = (p.material,)
        if rng.random() < 0.5:
            attributes += (rng.choice(p.features),)
        colour, size = rng.choice(p.colours), rng.choice(p.sizes)
        bound = (p.price_cents // 1000 + rng.choice((1, 1, 2))) * 1000  # whole tens of dollars, above the price
        described = " ".join(reversed(attributes))  # "slim fit cotton"
        price = f"${bound // 100}"
        template = rng.randrange(3)
        if template == 0:
            text = f"buy {_one(cat.name, f'{colour} {described}')} in size {size} under {price}"
        elif template == 1:
            text = f"i am looking for {_one(cat.name, described)} in {colour}, size {size}, for less than {price}"
        else:
            text = f"find me {colour} {described} {cat.plural} in size {size}, priced lower than {price}"
        return Goal(task_id, p.pid, p.category, attributes, colour, size, bound, text)

    # ------------------------------------------------------------ search and reward

    def search(self, query: str) -> list[Product]:
        """Products sharing a word with ``query``; a word in the name counts twice. Ties by id."""
        q = set(words(query))
        scored = []
        for p, name, every in zip(self.products, self._name_words, self._all_words):
            score = sum(2 if w in name else 1 for w in q if w in every)
            if score:
                scored.append((-score, p.pid))
        return [self.products[pid] for _, pid in sorted(scored)]

    def reward(self, goal: Goal, pid: int, colour: str, size: str) -> float:
        """Match fraction of the bought item (``pid`` in ``colour``/``size``) against ``goal``."""
        p = self.products[pid]
        if p.category != goal.category:
            return 0.0
        met = sum(a in p.attributes for a in goal.attributes)
        met += (colour == goal.colour) + (size == goal.size) + (p.price_cents < goal.max_price_cents)
        return met / (len(goal.attributes) + 3)


@functools.lru_cache(maxsize=8)
def catalogue(num_products: int = 300, seed: int = 0) -> Catalogue:
    """The shared catalogue for these options (built once per process, ~10 ms)."""
    return Catalogue(num_products, seed)
