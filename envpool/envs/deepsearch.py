"""``deepsearch``: answer a question by searching a BM25 index of the CIA World Factbook.

The corpus and the questions are ``agentgym.envpool.envs.factbook``'s (public domain, ~7.7k
passages, ~2.3k single- and multi-hop questions). The index is ``bm25s`` with PyStemmer's English
stemmer (plain tokens if PyStemmer is missing), built once per env instance, i.e. once per env
worker, in about a second; with ``cache_dir`` set it is saved there and loaded by later workers.

    options:  top_k: int = 3               passages shown per search
              passage_chars: int = 400      each passage shown cut to this many characters
              reward: str = "f1"            "f1" (token F1 with the gold answer) or "em" (exact match)
              cache_dir: str = ""           where to keep the index ("" = build in memory)
    task ids: indexes into ``factbook.questions()``: train, then dev, then test (``tasks(split)``)
    reset ->  "Question: ..."; ``instructions()`` explains the two actions
    actions:  search[QUERY]   the top_k passages for QUERY, numbered, with their titles
              answer[TEXT]    ends the episode
              (``<search>QUERY</search>`` and ``<answer>TEXT</answer>`` work too; the first action
              in the reply counts.) Anything else gets a reminder of the two forms; a turn all the same.
    reward:   on answer: F1 (or exact match) against the gold answer after SQuAD's normalisation
              (case, accents, punctuation, articles); success = exact match. Other turns 0.
    expert:   an oracle that searches for each gold passage in turn (its title and first 8 words as
              the query, 24 then 72 words if the passage was not among the results) until all were
              shown, then answers with the gold answer.
"""

from __future__ import annotations

import functools
import random
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.envpool.base import SPLITS, Env, StepResult
from agentgym.envpool.envs import factbook

_ACTION = re.compile(r"\b(search|answer)\[(.*?)\]|<(search|answer)>(.*?)</\3>", re.IGNORECASE | re.DOTALL)
TITLE_WEIGHT = 3
INVALID = "Invalid action. Reply with search[QUERY] to search the Factbook or answer[TEXT] to answer."


def _stemmer() -> Any:
    try:
        import Stemmer
    except ImportError:
        return None
    return Stemmer.Stemmer("english")


class Index:
    """BM25 over ``factbook.passages()``; ``search(query, k)`` -> passages, best first."""

    def __init__(self, cache_dir: str = "") -> None:
        import bm25s

        self.passages = factbook.passages()
        self._stem = _stemmer()
        name = f"factbook-bm25-{len(self.passages)}-t{TITLE_WEIGHT}-{'stem' if self._stem else 'plain'}"
        path = Path(cache_dir) / name if cache_dir else None
        if path is not None and (path / "params.index.json").exists():
            self._bm25 = bm25s.BM25.load(str(path), mmap=False, show_progress=False)
            return
        # The title counts three times: "capital of Chad" finds "Chad: Capital" (long, with its
        # etymology) in the top 3 for 96% of the single-hop questions, against 80% with it once.
        texts = [f"{p.title}. " * TITLE_WEIGHT + p.text for p in self.passages]
        tokens = bm25s.tokenize(texts, stopwords="en", stemmer=self._stem, show_progress=False)
        self._bm25 = bm25s.BM25()
        self._bm25.index(tokens, show_progress=False)
        if path is not None:
            # A directory of its own per writer: workers forked from one zygote share object ids
            # (and would share a name derived from them), so the name comes from tempfile.
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f"{path.name}.tmp", dir=path.parent))
            self._bm25.save(str(tmp), show_progress=False)
            try:
                tmp.rename(path)  # atomic: a concurrent worker's copy may already be there
            except OSError:
                import shutil

                shutil.rmtree(tmp, ignore_errors=True)

    def search(self, query: str, k: int) -> list[factbook.Passage]:
        import bm25s

        tokens = bm25s.tokenize([query], stopwords="en", stemmer=self._stem, show_progress=False)
        if not tokens.ids or not tokens.ids[0]:
            return []
        # Query tokens unknown to the corpus are dropped by bm25s; none known -> no results.
        docs, scores = self._bm25.retrieve(tokens, k=min(k, len(self.passages)), show_progress=False, n_threads=1)
        return [self.passages[int(d)] for d, s in zip(docs[0], scores[0]) if s > 0]


@functools.lru_cache(maxsize=4)
def _index(cache_dir: str) -> Index:
    return Index(cache_dir)


def parse_action(text: str) -> tuple[str, str] | None:
    m = _ACTION.search(text)
    if m is None:
        return None
    kind = (m.group(1) or m.group(3)).lower()
    arg = m.group(2) if m.group(1) else m.group(4)
    return kind, " ".join(arg.split())


class DeepSearch(Env):
    name = "deepsearch"

    def __init__(
        self, top_k: int = 3, passage_chars: int = 400, reward: str = "f1", cache_dir: str = "", **kwargs: object
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(top_k, int) or not 1 <= top_k <= 20:
            raise ValueError(f"deepsearch: option top_k must be an integer from 1 to 20, got {top_k!r}")
        if not isinstance(passage_chars, int) or passage_chars < 20:
            raise ValueError(f"deepsearch: option passage_chars must be an integer >= 20, got {passage_chars!r}")
        if reward not in ("f1", "em"):
            raise ValueError(f"deepsearch: option reward must be 'f1' or 'em', got {reward!r}")
        self.top_k, self.passage_chars, self.reward = top_k, passage_chars, reward
        self.index = _index(str(cache_dir))
        self._by_id = {p.id: p for p in self.index.passages}
        self._question: factbook.Question | None = None
        self._shown: set[str] = set()
        self._tries: dict[str, int] = {}
        self._done = False
        self._last = ""  # what the agent last read: random_action draws its words from it

    @classmethod
    def tasks(cls, split: str = "train", **options: object) -> Sequence[int]:
        if split not in SPLITS:
            raise ValueError(f"env deepsearch: unknown split {split!r}; splits are {list(SPLITS)}")
        return factbook.split_ranges()[split]

    def reset(self, task_id: int) -> str:
        qs = factbook.questions()
        if not 0 <= task_id < len(qs):
            raise ValueError(f"deepsearch: task id {task_id} out of range: questions are 0..{len(qs) - 1}")
        self._question = qs[task_id]
        self._shown = set()
        self._tries = {}
        self._done = False
        self._last = self._question.text
        return f"Question: {self._question.text}"

    @property
    def question(self) -> factbook.Question | None:
        return self._question

    def instructions(self) -> str:
        return (
            "Answer the question using the CIA World Factbook. Each turn, reply with exactly one action:\n"
            "search[QUERY] to get the most relevant Factbook passages for QUERY, or\n"
            "answer[TEXT] to give your final answer (a short phrase, no explanation); it ends the episode.\n"
            "Some questions need several searches: find the country first, then the fact."
        )

    def step(self, action: str) -> StepResult:
        q = self._question
        if q is None:
            return StepResult("No question: the episode has not started.", 0.0, False, {})
        if self._done:
            return StepResult("The episode is over.", 0.0, True, {"success": False})
        parsed = parse_action(action)
        if parsed is None:
            return StepResult(INVALID, 0.0, False, {"valid": False})
        kind, arg = parsed
        if kind == "answer":
            self._done = True
            em = factbook.exact_match(arg, q.answer)
            score = em if self.reward == "em" else factbook.f1(arg, q.answer)
            text = f"Your answer: {arg}. " + ("Correct." if em else "Not the expected answer.")
            return StepResult(text, score, True, {"success": bool(em), "em": em, "f1": factbook.f1(arg, q.answer)})
        if not arg:
            return StepResult("Empty query. " + INVALID, 0.0, False, {"valid": False})
        found = self.index.search(arg, self.top_k)
        self._shown.update(p.id for p in found)
        if not found:
            return StepResult(f"No passage matches {arg!r}.", 0.0, False, {"results": 0})
        lines = [f"[{i}] {p.title}\n{_cut(p.text, self.passage_chars)}" for i, p in enumerate(found, 1)]
        self._last = "\n".join(lines)
        return StepResult("\n".join(lines), 0.0, False, {"results": len(found)})

    def random_action(self, rng: random.Random) -> str:
        # Free text has no uniform distribution; the stand-in fills the two action forms with 1-4
        # consecutive words of what the agent last read (the question, or the passages shown):
        # the format, and no more knowledge than the page gives. Searches 3 times in 4.
        words = re.findall(r"[A-Za-z0-9]+", self._last) or ["country"]
        n = rng.randint(1, min(4, len(words)))
        i = rng.randrange(len(words) - n + 1)
        return f"{'answer' if rng.random() < 0.25 else 'search'}[{' '.join(words[i : i + n])}]"

    def expert_action(self) -> str:
        q = self._question
        if q is None:
            return "answer[]"
        for pid in q.hops:
            if pid not in self._shown:
                # The gold passage's title and first words; longer each time it was not found.
                n = 8 * 3 ** self._tries.get(pid, 0)
                self._tries[pid] = self._tries.get(pid, 0) + 1
                p = self._by_id[pid]
                query = re.sub(r"[\[\]<>]", " ", f"{p.title} {' '.join(p.text.split()[:n])}")
                return f"search[{' '.join(query.split())}]"
        return f"answer[{q.answer}]"


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3].rstrip() + "..."
