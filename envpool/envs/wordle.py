"""``wordle``: find a hidden word in a few guesses from per-letter feedback (after AgentGym's Wordle).

The words come from Debian's ``wamerican`` word list (``/usr/share/dict/american-english``): every
entry of ``length`` lowercase letters a-z (no capitals, so no proper names; no apostrophes). The
same list holds the hidden words and the accepted guesses. Each word belongs to one split by a
hash of the word itself (10% test, 5% dev, the rest train), so a word never changes split when
the list gains or loses entries.

    options:  length: int = 5 (4..7)          letters per word
              max_guesses: int = 6 (1..20)
              word_list: str = WORD_LIST      a file with one word per line
              progress_reward: bool | str = False   also reward each guess by what it tells:
                                  (ln|C_before| - ln|C_after|) / ln|C_start|, C the words of the
                                  list consistent with every feedback so far (C_start the whole
                                  list); a guess that rules nothing out gets 0, the answer the rest
                                  of the way (C_after = {answer}), so a solved game's shares sum
                                  to 1. true or "information": every guess; "consistent": only
                                  a guess consistent with every feedback so far (one of C_before,
                                  as Wordle's hard mode asks), so what is paid is reading the
                                  feedback, never a word itself. "marks": each guess paid what it
                                  adds to the best mark score so far, the score (2 per correct
                                  letter, 1 per present) / (2 x length), so the answer is paid the
                                  rest of the way to 1 and a guess no better than an earlier one
                                  gets 0 (a record, as maze's "record"). Success is still guessing
                                  the word.
              letters: bool = False       the env writes guesses and words as space-separated
                                  letters ("c r a n e", LMRL-Gym's Wordle format, which
                                  AgentGym's follows): in its instructions, the echo of each guess,
                                  the revealed word, random_action and expert_action. Either form
                                  is accepted as an answer in both modes.
              held_out: str = "words"     what a held-out task holds out. "words": each word
                                  belongs to one split (by its hash, above), so a test task's
                                  answer is never a training answer. "games": every word of the
                                  list is an answer in every split, and a task is one game whose
                                  answer is drawn from the whole list by a hash of its id, as
                                  AgentGym's Wordle (LMRL-Gym's) draws each game's word from its
                                  vocabulary by the game's seed: a test task is a game never
                                  played in training, whose word may have been.
    task ids: train 0..n_train-1 (an id below 2**30 wraps onto them), dev and test from 2**30 on,
              as ``Env.tasks(split)`` lists them; the word of an id is the id-th word of its split
              in alphabetical order, so it depends on the list's version. held_out "games":
              GAMES[split] ids a split from the same starts (any train id below 2**30 is a game).
    reset ->  "Guess the 5-letter word. You have 6 guesses."
    action:   one word ("crane"; "guess: crane" and "c r a n e" are accepted too)
    step  ->  "crane: c absent, r correct, a present, n absent, e absent. 5 guesses left."
              correct = right letter, right place; present = in the word elsewhere (a letter is
              marked present at most as often as the word has it beyond its correct places).
    reward:   1 when the word is guessed (done, success); after ``max_guesses`` wrong guesses done
              with reward 0 and the word revealed. A text that is not one word of the list gets
              feedback, counts as a turn and uses no guess.
    expert:   a solver that only uses the feedback so far: it keeps the words consistent with it
              and guesses the word that splits them into the most feedback classes.

A missing word list is an error naming the Debian package that provides it.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import math
import random
import re
from collections.abc import Sequence
from pathlib import Path

from agentgym.envpool.base import SPLITS, Env, StepResult

WORD_LIST = "/usr/share/dict/american-english"
"""Debian's ``wamerican`` list (``apt-get install wamerican``)."""

_SPLIT_START = {"train": 0, "dev": 1 << 30, "test": (1 << 30) + 10_000}  # Env's default ranges
GAMES = {"train": 100_000, "dev": 1_000, "test": 1_000}
"""held_out "games": how many games each split lists (dev's fit below the test ids' start)."""
HELD_OUT = ("words", "games")
_ANSWER = re.compile(r"^(?:guess\s*:\s*|guess\s+)?([a-z]+|[a-z](?: [a-z])+)$")  # a word, or its letters spaced
_OPENER_POOL = 400  # with more candidates than this, guess by letter frequency (cheap)
_WIDE_POOL = 400  # with at most this many candidates, non-candidate words may be guessed too

CORRECT, PRESENT, ABSENT = "correct", "present", "absent"
_MARK = {CORRECT: 2, PRESENT: 1, ABSENT: 0}


def split_of(word: str) -> str:
    """The split a word belongs to: a function of the word alone (10% test, 5% dev)."""
    bucket = hashlib.sha256(word.encode()).digest()[0] % 20
    return "test" if bucket < 2 else "dev" if bucket == 2 else "train"


@functools.lru_cache(maxsize=8)
def load_words(path: str = WORD_LIST, length: int = 5, held_out: str = "words") -> dict[str, tuple[str, ...]]:
    """The words of ``length`` letters in ``path`` by split, each sorted (held_out "games" needs a
    word, not every split)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"wordle: word list {path} not found; the default list {WORD_LIST} comes with the Debian "
            "package wamerican (apt-get install wamerican)"
        )
    pattern = re.compile(rf"^[a-z]{{{length}}}$")
    words = sorted({w for w in file.read_text(encoding="utf-8", errors="replace").split() if pattern.match(w)})
    by_split: dict[str, list[str]] = {s: [] for s in SPLITS}
    for w in words:
        by_split[split_of(w)].append(w)
    if held_out == "games" and not words:
        raise ValueError(f"wordle: word list {path} has no {length}-letter word")
    if held_out != "games" and not all(by_split.values()):
        sizes = {s: len(v) for s, v in by_split.items()}
        raise ValueError(f"wordle: word list {path} has too few {length}-letter words for all splits: {sizes}")
    room = _SPLIT_START["test"] - _SPLIT_START["dev"]
    if held_out != "games" and len(by_split["dev"]) > room:  # games: the ids are games, not words
        raise ValueError(
            f"wordle: word list {path} has {len(by_split['dev'])} dev words of {length} letters; dev task ids "
            f"have room for {room} before the test ids start: use a shorter list"
        )
    return {s: tuple(v) for s, v in by_split.items()}


def feedback(guess: str, answer: str) -> tuple[str, ...]:
    """Wordle's marks for ``guess`` against ``answer``: correct places first, then present
    letters left to right while the answer has unmatched copies of them."""
    marks = [CORRECT if g == a else ABSENT for g, a in zip(guess, answer)]
    left = collections.Counter(a for a, m in zip(answer, marks) if m != CORRECT)
    for i, g in enumerate(guess):
        if marks[i] != CORRECT and left[g] > 0:
            marks[i] = PRESENT
            left[g] -= 1
    return tuple(marks)


def _options(
    length: object, max_guesses: object, word_list: object, held_out: object = "words"
) -> tuple[int, int, str]:
    if held_out not in HELD_OUT:
        raise ValueError(f"wordle: option held_out must be one of {list(HELD_OUT)}, got {held_out!r}")
    for key, value, lo, hi in (("length", length, 4, 7), ("max_guesses", max_guesses, 1, 20)):
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise ValueError(f"wordle: option {key} must be an integer from {lo} to {hi}, got {value!r}")
    if not isinstance(word_list, str) or not word_list:
        raise TypeError(f"wordle: option word_list must be a file path, got {word_list!r}")
    return length, max_guesses, word_list  # type: ignore[return-value]  # checked above; mypy cannot narrow through the loop


class Wordle(Env):
    name = "wordle"

    def __init__(
        self,
        length: int = 5,
        max_guesses: int = 6,
        word_list: str = WORD_LIST,
        progress_reward: bool | str = False,
        letters: bool = False,
        held_out: str = "words",
        **kwargs: object,
    ) -> None:
        super().__init__(**kwargs)
        self.length, self.max_guesses, self.word_list = _options(length, max_guesses, word_list, held_out)
        self.held_out = held_out
        if not (isinstance(progress_reward, bool) or progress_reward in ("information", "consistent", "marks")):
            raise ValueError(
                f'wordle: option progress_reward must be false, true, "information", "consistent" or "marks", got {progress_reward!r}'
            )
        self.progress_reward = "information" if progress_reward is True else (progress_reward or "")
        if not isinstance(letters, bool):
            raise TypeError(f"wordle: option letters must be true or false, got {letters!r}")
        self.letters = letters
        self._splits = load_words(self.word_list, self.length, held_out)
        self._all = frozenset(w for words in self._splits.values() for w in words)
        self._sorted_all = tuple(sorted(self._all))
        self._answer: str | None = None
        self._guesses: list[tuple[str, tuple[str, ...]]] = []
        self._candidates: list[str] = []  # the expert's: words consistent with the feedback so far
        self._filtered = 0  # how many guesses the candidates account for
        self._turns = 0
        self._done = True

    @classmethod
    def tasks(cls, split: str = "train", **options: object) -> Sequence[int]:
        if split not in SPLITS:
            raise ValueError(f"env wordle: unknown split {split!r}; splits are {list(SPLITS)}")
        held_out = options.get("held_out", "words")
        length, _, path = _options(
            options.get("length", 5), options.get("max_guesses", 6), options.get("word_list", WORD_LIST), held_out
        )
        start = _SPLIT_START[split]
        words = load_words(path, length, held_out)[split]  # read in both modes: a missing or short list is an error
        return range(start, start + (GAMES[split] if held_out == "games" else len(words)))

    def word(self, task_id: int) -> str:
        """The hidden word of ``task_id``."""
        for split in ("test", "dev", "train"):  # highest start first
            start = _SPLIT_START[split]
            if task_id >= start:
                if self.held_out == "games":
                    if split != "train" and task_id - start >= GAMES[split]:
                        raise ValueError(
                            f"wordle: task id {task_id} is past the {split} split "
                            f"({GAMES[split]} games from id {start})"
                        )
                    seed = hashlib.sha256(f"wordle game {task_id}".encode()).digest()
                    return self._sorted_all[int.from_bytes(seed[:8], "big") % len(self._sorted_all)]
                words = self._splits[split]
                if split == "train":
                    return words[task_id % len(words)]
                if task_id - start < len(words):
                    return words[task_id - start]
                raise ValueError(
                    f"wordle: task id {task_id} is past the {split} split ({len(words)} words from id {start})"
                )
        raise ValueError(f"wordle: task id must be >= 0, got {task_id}")

    def reset(self, task_id: int) -> str:
        self._answer = self.word(task_id)
        self._guesses = []
        self._candidates = list(self._sorted_all)
        self._filtered = 0
        self._turns = 0
        self._done = False
        return f"Guess the {self.length}-letter word. You have {self.max_guesses} guesses."

    def _score(self, marks: tuple[str, ...]) -> float:
        """A guess's mark score (progress_reward "marks"): (2 per correct, 1 per present) / (2 x length)."""
        return sum(_MARK[k] for k in marks) / (2 * self.length)

    def _shown(self, word: str) -> str:
        """``word`` as the env writes it: spaced letters in ``letters`` mode."""
        return " ".join(word) if self.letters else word

    def instructions(self) -> str:
        answer = (
            f"its {self.length} letters separated by spaces, e.g. {self._shown(self._sorted_all[0])!r}"
            if self.letters
            else "one word"
        )
        return (
            f"Play Wordle: find a hidden English word of {self.length} letters in at most {self.max_guesses} "
            f"guesses. Answer each turn with {answer}. After each guess you learn, letter by letter, "
            "whether it is correct (right letter, right place), present (in the word, elsewhere) or "
            "absent (not in the word)."
        )

    def step(self, action: str) -> StepResult:
        if self._answer is None or self._done:
            return StepResult("The game is over.", 0.0, True, {"turns": self._turns, "success": False})
        self._turns += 1
        m = _ANSWER.match(" ".join(action.lower().strip().strip(".!\"'`*").split()))
        guess = m.group(1).replace(" ", "") if m else None
        if guess is None or len(guess) != self.length or guess not in self._all:
            shown = action.strip()[:40]
            why = f"{shown!r} is not a {self.length}-letter word of the word list" if shown else "Empty answer"
            left = self.max_guesses - len(self._guesses)
            form = (
                f"its {self.length} letters separated by spaces" if self.letters else f"one {self.length}-letter word"
            )
            text = f"{why}. Answer with {form}. {_left(left)}"
            return StepResult(text, 0.0, False, {"turns": self._turns, "valid": False, "guesses": len(self._guesses)})
        marks = feedback(guess, self._answer)
        if self.progress_reward == "marks":  # what the guess adds to the best mark score so far
            gain = max(0.0, self._score(marks) - max((self._score(k) for _, k in self._guesses), default=0.0))
            self._guesses.append((guess, marks))
        else:
            cands = self._consistent() if self.progress_reward else []
            before, paid = len(cands), self.progress_reward == "information" or guess in cands
            self._guesses.append((guess, marks))
            # The share of the list's information this guess gave (progress_reward; "consistent":
            # only for a guess the feedback so far allowed), 0 otherwise.
            gain = math.log(before / len(self._consistent())) / math.log(len(self._all)) if paid and before else 0.0
        info: dict[str, str | int | float | bool] = {"turns": self._turns, "guesses": len(self._guesses)}
        if guess == self._answer:
            self._done = True
            return StepResult(
                f"{self._shown(guess)}: correct! You found the word.", 1.0 + gain, True, {**info, "success": True}
            )
        text = self._marks_text(guess, marks)
        left = self.max_guesses - len(self._guesses)
        if left == 0:
            self._done = True
            return StepResult(
                f"{text} No guesses left; the word was {self._shown(self._answer)}.",
                0.0,
                True,
                {**info, "success": False},
            )
        return StepResult(f"{text} {_left(left)}", gain, False, info)

    def _marks_text(self, guess: str, marks: tuple[str, ...]) -> str:
        return f"{self._shown(guess)}: " + ", ".join(f"{g} {m}" for g, m in zip(guess, marks)) + "."

    def quiz(self) -> tuple[str, str] | None:
        """After a lost game: its last feedback, then "No guesses left. What was the word?", and
        the word (``Env.quiz``)."""
        if not self._done or not self._guesses or self._guesses[-1][0] == self._answer:
            return None
        guess, marks = self._guesses[-1]
        assert self._answer is not None  # a game was played
        return f"{self._marks_text(guess, marks)} No guesses left. What was the word?", self._shown(self._answer)

    def _consistent(self) -> list[str]:
        """The words of the list consistent with every feedback so far (the expert's candidates;
        once the answer is guessed, the answer alone)."""
        if self._guesses and self._guesses[-1][0] == self._answer:
            return [self._answer]
        cands = self._candidates
        for guess, marks in self._guesses[self._filtered :]:
            code = sum(_MARK[m] * 3 ** (self.length - 1 - i) for i, m in enumerate(marks))
            keep = patterns(_codes((guess,)), _codes(tuple(cands)))[0] == code
            cands = [w for w, k in zip(cands, keep) if k]
        self._candidates, self._filtered = cands, len(self._guesses)
        return cands

    def random_action(self, rng: random.Random) -> str:
        # Any word of the list (the action space), whatever the feedback said.
        return self._shown(rng.choice(self._sorted_all))

    def expert_action(self) -> str:
        return self._shown(self._expert_word())

    def _expert_word(self) -> str:
        if self._answer is None or self._done:
            return self._sorted_all[0]
        cands = self._consistent()
        left = self.max_guesses - len(self._guesses)
        if len(cands) <= 2 or left == 1:
            return cands[0]
        if len(cands) > _OPENER_POOL:
            return _by_letter_frequency(tuple(cands))
        return _best_guess(self._sorted_all, tuple(cands), min(left, 3))


@functools.lru_cache(maxsize=1024)  # the same feedback leads to the same candidates: plan once
def _best_guess(words: tuple[str, ...], cands: tuple[str, ...], left: int) -> str:
    """Any word of the list (only candidates while there are many) that leaves the fewest
    candidates on average (sum of squared class sizes), or, with two guesses left, the one that
    pins down the most candidates; a candidate wins ties."""
    import numpy as np

    pool = words if len(cands) <= _WIDE_POOL else cands
    codes = patterns(_codes(pool), _codes(cands))
    n_codes = 3 ** len(cands[0])
    flat = (np.arange(len(pool))[:, None] * n_codes + codes).ravel()
    sizes = np.bincount(flat, minlength=len(pool) * n_codes).reshape(len(pool), n_codes).astype(np.int64)
    members = set(cands)
    is_member = np.fromiter((w in members for w in pool), dtype=np.int64, count=len(pool))
    if left == 2:
        cost = -2 * (sizes == 1).sum(axis=1) - is_member
    else:
        cost = 2 * (sizes**2).sum(axis=1) - is_member
    return pool[int(np.argmin(cost))]


@functools.lru_cache(maxsize=8)
def _codes(words: tuple[str, ...]):  # noqa: ANN202 - numpy is imported lazily
    import numpy as np

    return np.frombuffer("".join(words).encode(), dtype=np.uint8).reshape(len(words), -1) - ord("a")


def patterns(guesses, answers):  # noqa: ANN001, ANN201 - numpy arrays (G, L) and (A, L) of letters 0..25
    """``feedback`` for every (guess, answer) pair at once, as base-3 codes (2 correct, 1 present)."""
    import numpy as np

    length = guesses.shape[1]
    green = [guesses[:, None, i] == answers[None, :, i] for i in range(length)]  # (G, A) each
    counts = np.zeros((len(answers), 26), dtype=np.int16)  # letter counts of each answer
    for i in range(length):
        np.add.at(counts, (np.arange(len(answers)), answers[:, i]), 1)
    code = np.zeros((len(guesses), len(answers)), dtype=np.int32)
    for i in range(length):
        same = [guesses[:, j] == guesses[:, i] for j in range(length)]  # (G,) each: same letter
        # Copies of this letter in the answer outside its correct places ...
        free = counts[:, guesses[:, i]].T.astype(np.int16)
        for k in range(length):
            free -= green[k] & same[k][:, None]
        # ... minus those taken by earlier non-correct copies of it in the guess.
        for j in range(i):
            free -= ~green[j] & same[j][:, None]
        present = ~green[i] & (free > 0)
        code = code * 3 + np.where(green[i], 2, present)
    return code


def _left(n: int) -> str:
    return f"{n} guess left." if n == 1 else f"{n} guesses left."


@functools.lru_cache(maxsize=64)
def _by_letter_frequency(cands: tuple[str, ...]) -> str:
    """The candidate whose distinct letters are the most common among the candidates."""
    freq = collections.Counter(ch for w in cands for ch in set(w))
    return max(cands, key=lambda w: (sum(freq[ch] for ch in set(w)), w))
