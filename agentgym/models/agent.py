"""The demo model family that can act in every built-in env: one tokenizer, a ladder of sizes.

    from agentgym.models.agent import make_agent_model
    make_agent_model(Path("models/agent-small"), "agent-small", seed=0)

    agentgym make-model --arch agent-small --pretrain-steps 1500 --pretrain-env mix models/agent-small-base

The quickstart's ``tiny`` model has a 187-token vocabulary trained on guess_number's words: an
action of another env is many bytes' worth of tokens (``move up`` 7, ``craft 4 oak planks using
1 oak log`` 28), which the random model almost never samples. This family's tokenizer is trained
on the text of every built-in env (``agent_corpus``: their instructions, and the observations and
actions of seeded random and expert play), so an env's words are one token each and an action a
few tokens (``move up`` 2, ``turn left`` 2, a craft command 10: digits are always one token each,
as in Qwen2). The architecture, file layout and tokenizer rules are ``agentgym.models.tiny``'s;
only the corpus, the vocabulary bound and the sizes differ. The ladder (``SIZES``):

    agent-tiny    hidden 64, 2 layers    the tests' model (the tiny model's sizes)
    agent-small   hidden 128, 4 layers   the results' model (bench/results.py), sized so that a
                                         results run fits 20 minutes on 2 CPU cores

The random weights know nothing; ``agentgym.models.base`` pretrains them on random play of an
env or of the env mix (``GAME_MIX``) to stand in for a pretrained checkpoint. SciWorld's texts
come from its instructions and action forms only (its task descriptions and rooms need the JVM),
WebShop's from its instructions and catalogue, deep search's from its instructions, questions
and a sample of passages: they are tokenized less tightly than the games.
"""

from __future__ import annotations

import random
from pathlib import Path

from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model

SIZES: dict[str, dict[str, int]] = {
    "agent-tiny": dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=192),
    "agent-small": dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384),
}
"""The family's sizes (all with head_dim 32, which vLLM's CPU attention supports)."""

VOCAB_SIZE = 2048
"""Upper bound on the family's vocabulary (byte-level BPE over ``agent_corpus``)."""

BABYAI_LEVELS = "GoToObj,GoToRedBallGrey,GoToLocal,PickupLoc,PutNextLocal"
"""The single-room BabyAI levels: the ones a turn limit of a few dozen can solve."""

GAME_MIX: list[tuple[str, dict, float]] = [
    ("maze", {"size": 3}, 1.0),
    ("maze", {"size": 5}, 1.0),
    ("textcraft", {"depth": 1, "distractors": 2}, 1.0),
    ("textcraft", {"depth": 2, "distractors": 2}, 1.0),
    ("wordle", {"word_list": "configs/envs/wordle-small.txt"}, 1.0),
    ("babyai", {"levels": BABYAI_LEVELS}, 1.0),
    ("guess_number", {"low": 1, "high": 8}, 1.0),
]
"""The game envs (pure Python, fast to play) and their options: what ``--pretrain-env mix`` plays."""


def _play_texts(env: object, episodes: int, turns: int, seed: int) -> list[str]:
    """Instructions, observations and actions of ``episodes`` episodes, each turn's action the
    expert's or a random one (a coin flip), so the corpus holds both good and useless moves."""
    rng = random.Random(seed)
    texts: list[str] = []
    for i in range(episodes):
        texts.append(env.reset(i))  # type: ignore[attr-defined]  # env: an Env, typed object here
        texts.append(env.instructions())  # type: ignore[attr-defined]  # env: an Env, typed object here
        for _ in range(turns):
            action = env.expert_action() if rng.random() < 0.5 else env.random_action(rng)  # type: ignore[attr-defined]  # env: an Env, typed object here
            result = env.step(action)  # type: ignore[attr-defined]  # env: an Env, typed object here
            texts += [action, result.observation]
            if result.done:
                break
    return texts


def agent_corpus() -> list[str]:
    """The texts of every built-in env (deterministic: same packages, same list)."""
    from agentgym.envpool.envs import factbook, guess_number, sciworld
    from agentgym.envpool.envs.babyai import BabyAI
    from agentgym.envpool.envs.deepsearch import INVALID, DeepSearch
    from agentgym.envpool.envs.maze import Maze
    from agentgym.envpool.envs.textcraft import MATERIALS, RAW, THINGS, TextCraft
    from agentgym.envpool.envs.webshop import catalogue, observe
    from agentgym.envpool.envs.webshop.env import instructions as shop_instructions
    from agentgym.envpool.envs.wordle import Wordle

    texts = list(guess_number.CORPUS) + list(FALLBACK_CORPUS)
    for size in (3, 5, 7):
        texts += _play_texts(Maze(size=size), 40, 12, seed=size)
    texts += list(RAW) + [f"{m} {t}" for m in MATERIALS for t in THINGS]
    for depth in (1, 2, 3):
        texts += _play_texts(TextCraft(depth=depth, distractors=2), 40, 12, seed=depth)
    small = Path(__file__).resolve().parents[2] / "configs" / "envs" / "wordle-small.txt"
    if small.exists():
        texts += small.read_text().split() * 10
        texts += _play_texts(Wordle(word_list=str(small)), 20, 6, seed=0)
    texts += _play_texts(BabyAI(levels=BABYAI_LEVELS), 30, 10, seed=0)
    # SciWorld and WebShop are not played here (a JVM, a browser): their action forms, filled with
    # things they show, stand in for play, repeated as often as a played env's actions appear.
    things = (
        "thermometer",
        "door to kitchen",
        "door to hallway",
        "stove",
        "sink",
        "pot",
        "water",
        "ice",
        "seed jar",
        "flower pot",
        "orange",
        "table",
        "agent",
        "kitchen",
        "hallway",
        "outside",
    )
    sci = [
        f.replace("OBJ to OBJ", f"{a} to {b}")
        .replace("OBJ into OBJ", f"{a} into {b}")
        .replace("[on OBJ]", f"on {b}")
        .replace("OBJ", a)
        .replace("LOC", b)
        for f in sciworld.ACTION_FORMS
        for a, b in zip(things, things[1:] + things[:1])
    ]
    texts += [*sciworld.SPLITS, "No known action matches that input.", "Action: look around", *(sci * 3)]
    cat = catalogue.catalogue(300, seed=0)
    texts += [shop_instructions(cat.goal(t)) for t in range(0, 2400, 37)]
    texts += [observe.ACTIONS_HELP, *(f"{p.name} {p.description}" for p in cat.products[:100])]
    texts += [f"click [{i}]" for i in range(60)] * 5 + ["scroll down", "scroll up", "go back"] * 40
    texts += [
        f"type [{i % 5}] {cat.goal(t).instruction.split(',')[0][:40]} [enter]" for i, t in enumerate(range(0, 2400, 11))
    ]
    qs = factbook.questions()
    texts += [INVALID, *(f"Question: {q.text}" for q in qs[::10]), *(q.answer for q in qs[::10])]
    texts += _play_texts(DeepSearch(top_k=2, passage_chars=200), 40, 4, seed=0)
    texts += [p.text[:400] for p in factbook.passages()[::40]]
    return [t for t in texts if t]


def make_agent_model(
    out_dir: Path, arch: str = "agent-tiny", *, seed: int = 0, corpus: list[str] | None = None
) -> Path:
    """Write the family's ``arch`` model (random weights, the all-env tokenizer) to ``out_dir``."""
    if arch not in SIZES:
        raise ValueError(f"make_agent_model: unknown arch {arch!r}; the family has {', '.join(SIZES)}")
    return make_tiny_model(
        out_dir,
        corpus=corpus if corpus is not None else agent_corpus(),
        seed=seed,
        vocab_size=VOCAB_SIZE,
        **SIZES[arch],
    )
