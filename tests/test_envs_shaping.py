"""Progress rewards of the game envs that have them beyond maze and TextCraft: Wordle's
information share (envpool/envs/wordle.py, ``progress_reward``)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from agentgym.envpool.envs.wordle import Wordle, feedback

SMALL = str(Path(__file__).resolve().parents[1] / "configs" / "envs" / "wordle-small.txt")


def _consistent(words: list[str], history: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """The words consistent with every feedback, by the rules themselves (no shortcut)."""
    return [w for w in words if all(feedback(g, w) == m for g, m in history)]


def test_wordle_progress_is_the_share_of_information_and_success_stays_the_word() -> None:
    plain, paid = Wordle(word_list=SMALL), Wordle(word_list=SMALL, progress_reward=True)
    words = sorted(paid._all)
    rng = random.Random(0)
    for task in [*Wordle.tasks("test", word_list=SMALL)][:4] + [*Wordle.tasks("train", word_list=SMALL)][:4]:
        assert paid.reset(task) == plain.reset(task)
        answer, history, total = paid.word(task), [], 0.0
        for turn in range(6):
            guess = paid.expert_action() if turn % 2 else rng.choice(words)  # informative or not
            before = len(_consistent(words, history))
            r, r_plain = paid.step(guess), plain.step(guess)
            assert r.observation == r_plain.observation and r.done == r_plain.done
            history.append((guess, feedback(guess, answer)))
            after = 1 if guess == answer else len(_consistent(words, history))
            share = math.log(before / after) / math.log(len(words))
            assert r.reward == pytest.approx(r_plain.reward + share)
            total += share
            if r.done:
                break
        if r.info.get("success"):
            assert total == pytest.approx(1.0)  # the whole list's information, once solved
    paid.reset(0)
    assert paid.step("zzzzz").reward == 0.0  # not a word: nothing learnt, nothing paid
    for bad in (1, "consistant"):
        with pytest.raises(
            ValueError, match='progress_reward must be false, true, "information", "consistent" or "marks"'
        ):
            Wordle(word_list=SMALL, progress_reward=bad)


def test_wordle_consistent_progress_pays_only_guesses_the_feedback_allowed() -> None:
    """``progress_reward = "consistent"``: the same share, paid only for a guess that was still
    possible (hard mode); one the feedback had ruled out earns nothing, whatever it tells."""
    info = Wordle(word_list=SMALL, progress_reward="information")
    hard = Wordle(word_list=SMALL, progress_reward="consistent")
    words = sorted(hard._all)
    rng = random.Random(1)
    seen = {True: 0, False: 0}
    for task in [*Wordle.tasks("test", word_list=SMALL)] + [*Wordle.tasks("train", word_list=SMALL)][:20]:
        info.reset(task), hard.reset(task)
        answer, history = hard.word(task), []
        for turn in range(6):
            allowed = _consistent(words, history)
            ruled_out = [w for w in words if w not in allowed]
            guess = rng.choice(ruled_out if turn % 2 and ruled_out else allowed)  # possible or not
            r_info, r_hard = info.step(guess), hard.step(guess)
            assert r_hard.observation == r_info.observation and r_hard.done == r_info.done
            seen[guess in allowed] += 1
            assert r_hard.reward == (r_info.reward if guess in allowed else 0.0)
            history.append((guess, feedback(guess, answer)))
            if r_hard.done:
                assert r_hard.info["success"] == (guess == answer)
                break
    assert seen[True] > 10 and seen[False] > 10  # both kinds of guess were tried


def test_wordle_marks_progress_pays_each_new_best_mark_score_up_to_one() -> None:
    """``progress_reward = "marks"``: a guess is paid what it adds to the best (2 x correct +
    present) / 10 so far; one no better earns nothing, the answer the rest of the way to 1."""
    plain, paid = Wordle(word_list=SMALL), Wordle(word_list=SMALL, progress_reward="marks")
    words = sorted(paid._all)
    rng = random.Random(2)
    gained = 0
    for task in [*Wordle.tasks("test", word_list=SMALL)] + [*Wordle.tasks("train", word_list=SMALL)][:10]:
        plain.reset(task), paid.reset(task)
        answer, best, total = paid.word(task), 0.0, 0.0
        for turn in range(6):
            guess = paid.expert_action() if turn >= 3 else rng.choice(words)
            r, r_plain = paid.step(guess), plain.step(guess)
            assert r.observation == r_plain.observation and r.done == r_plain.done
            marks = feedback(guess, answer)
            score = (2 * marks.count("correct") + marks.count("present")) / 10
            assert r.reward - r_plain.reward == pytest.approx(max(0.0, score - best))
            gained += score > best
            best, total = max(best, score), total + r.reward - r_plain.reward
            if r.done:
                break
        assert total == pytest.approx(best)
        if r.info.get("success"):
            assert total == pytest.approx(1.0)
    assert gained > 10
