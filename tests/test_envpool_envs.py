"""Envs in-process (guess_number, chaos), the registry, and the env worker frames (no subprocess)."""

from __future__ import annotations

import math
import random
import time

import msgspec
import pytest

from agentgym.envpool.base import Env, StepResult
from agentgym.envpool.envs.chaos import Chaos
from agentgym.envpool.envs.guess_number import CORPUS, GuessNumber, corpus
from agentgym.envpool.registry import (
    UnknownEnvError,
    env_target,
    known_envs,
    load_target,
    register_env,
    resolve_env,
)
from agentgym.protocol.envworker import (
    MAX_FRAME_BYTES,
    PREFIX,
    Action,
    Close,
    Expert,
    Failure,
    FrameTooLarge,
    Observation,
    Open,
    Ready,
    Reset,
    Step,
    body_length,
    decode_reply,
    decode_request,
    pack_frame,
)
from agentgym.protocol.errors import ProtocolError


def play_expert(env: Env, task_id: int, max_turns: int = 50) -> list[StepResult]:
    env.reset(task_id)
    results = []
    for _ in range(max_turns):
        results.append(env.step(env.expert_action()))
        if results[-1].done:
            break
    return results


# ---------------------------------------------------------------- guess_number


def test_guess_number_contract() -> None:
    env = GuessNumber()
    assert env.reset(3) == "guess a number from 1 to 8"
    assert "higher" in env.instructions() and "8" in env.instructions()
    target = random.Random(3).randint(1, 8)
    if target > 1:
        r = env.step("1")
        assert (r.observation, r.reward, r.done, r.info) == ("higher", 0.0, False, {"turns": 1})
    if target < 8:
        r = env.step("my guess is 8")
        assert (r.observation, r.reward, r.done) == ("lower", 0.0, False)
    r = env.step(f" {target}, final")
    assert (r.observation, r.reward, r.done) == ("correct", 1.0, True)
    assert r.info["success"] is True
    after = env.step(str(target))  # the game is over: no second reward
    assert (after.observation, after.reward, after.done) == ("game over", 0.0, True)


def test_guess_number_show_range_says_what_the_hints_allow() -> None:
    # Target 5 (task 5): each hint carries the interval that the hints so far leave, and it
    # only narrows (a guess outside it changes nothing); the rest of the game is unchanged.
    env = GuessNumber(show_range=True)
    env.reset(5)
    assert env._target == 5
    seen = [env.step(a).observation for a in ["4", "7", "2", "x", "6", "5"]]
    assert seen == [
        "higher, 5 to 8",
        "lower, 5 to 6",
        "higher, 5 to 6",
        "invalid, say a number from 1 to 8",
        "lower, 5 to 5",
        "correct",
    ]
    plain = GuessNumber()
    plain.reset(5)
    assert [plain.step(a).observation for a in ["4", "7"]] == ["higher", "lower"]
    # Every word and digit of the hints is one the tiny model's tokenizer was trained on.
    assert {"higher", "lower", "to", "5", "8"} <= {w for t in CORPUS for w in t.replace(",", " ").split()}
    with pytest.raises(TypeError, match="show_range"):
        GuessNumber(show_range="yes")


def test_guess_number_held_out_targets_are_never_training_targets() -> None:
    # held_out "targets": the test split's games ask for numbers no training game asks for, so a
    # held-out game is never a training game (the overlap replay of bench/task_overlap.py finds 0).
    env = GuessNumber(held_out="targets")
    drawn = {}
    for split in ("train", "dev", "test"):
        ids = GuessNumber.tasks(split)[:300]  # a range: sliced, never listed
        drawn[split] = set()
        for i in ids:
            env.reset(i)
            drawn[split].add(env._target)
    assert drawn == {"train": {1, 4, 5, 8}, "dev": {3, 7}, "test": {2, 6}}
    # The game itself is unchanged: the expert still finds a held-out number.
    env.reset(next(iter(GuessNumber.tasks("test"))))
    for _ in range(4):
        result = env.step(env.expert_action())
        if result.done:
            break
    assert result.info.get("success") is True
    # The default draws any number in every split: test games repeat training games.
    plain = GuessNumber()
    test_targets = set()
    for i in GuessNumber.tasks("test")[:300]:
        plain.reset(i)
        test_targets.add(plain._target)
    assert test_targets == set(range(1, 9))
    with pytest.raises(ValueError, match="held_out must be one of"):
        GuessNumber(held_out="words")
    with pytest.raises(ValueError, match="at least 3 numbers"):
        GuessNumber(low=1, high=2, held_out="targets")


def test_guess_number_shaping_rewards_narrowing_and_telescopes() -> None:
    # Target 5 (task 5), shaping 0.3 over N = 8 (3 bits): a guess halving the interval earns
    # 0.3 / 3; one outside it, an invalid reply and a repeat earn 0; the last bit comes with the win.
    env = GuessNumber(shaping=0.3)
    env.reset(5)
    got = [(r.observation, r.reward, r.done) for r in (env.step(a) for a in ["4", "4", "7", "2", "x", "6", "5"])]
    assert [o for o, _, _ in got] == [
        "higher",
        "higher",
        "lower",
        "higher",
        "invalid, say a number from 1 to 8",
        "lower",
        "correct",
    ]
    assert [r for _, r, _ in got] == pytest.approx([0.1, 0.0, 0.1, 0.0, 0.0, 0.1, 1.0])
    # A first-guess win earns the whole shaping at once; over any episode the shaping sums to
    # shaping * (bits found / bits needed), so a win is worth 1 + shaping however it was reached.
    lucky = GuessNumber(shaping=0.3)
    lucky.reset(5)
    assert lucky.step("5").reward == pytest.approx(1.3)
    failed = GuessNumber(shaping=0.3)
    failed.reset(5)
    assert sum(failed.step(a).reward for a in ["1", "8", "3"]) == pytest.approx(0.3 * (3 - 2) / 3)  # 1..8 -> 4..7
    plain = GuessNumber()
    plain.reset(5)
    assert [plain.step(a).reward for a in ["4", "5"]] == [0.0, 1.0]  # off by default
    for bad in (-0.1, "0.5", True, float("inf")):
        with pytest.raises(ValueError, match="shaping"):
            GuessNumber(shaping=bad)


def test_guess_number_is_deterministic_in_task_id() -> None:
    actions = ["4", "x", "6", "2", "7", "1", "3", "5", "8"]

    def transcript(env: GuessNumber, task_id: int) -> list[tuple[str, float, bool]]:
        texts = [(env.reset(task_id), 0.0, False)]
        return texts + [(r.observation, r.reward, r.done) for r in (env.step(a) for a in actions)]

    a, b = GuessNumber(), GuessNumber()
    for task_id in range(40):
        assert transcript(a, task_id) == transcript(b, task_id)
    # Reusing an instance across episodes changes nothing either.
    assert transcript(a, 7) == transcript(GuessNumber(), 7)
    # And the targets actually vary with the task id.
    targets = {random.Random(t).randint(1, 8) for t in range(40)}
    assert len(targets) == 8


def test_guess_number_latency_is_a_seeded_log_normal_wait_that_changes_nothing_else() -> None:
    slow = GuessNumber(step_latency_s=0.02, latency_sigma=1.0)
    waits = [slow.latency(task, turn) for task in range(400) for turn in (1, 2, 3)]
    assert waits == [
        GuessNumber(step_latency_s=0.02, latency_sigma=1.0).latency(t, n) for t in range(400) for n in (1, 2, 3)
    ]
    waits.sort()
    median = waits[len(waits) // 2]
    assert 0.017 < median < 0.023  # log-normal: the median is step_latency_s
    assert waits[-1] > 5 * median and waits[0] < median / 5  # a long tail both ways
    assert sum(waits) / len(waits) > 1.4 * median  # mean = median * exp(sigma^2 / 2) = 1.65x
    assert len(set(waits)) == len(waits)  # each (task, turn) draws its own
    assert {GuessNumber(step_latency_s=0.02).latency(t, 1) for t in range(5)} == {0.02}  # sigma 0: fixed
    assert GuessNumber().latency(3, 1) == 0.0
    # The wait really happens (a sleep lasts at least what it asks; no upper bound is checked) and
    # the game is the same one.
    fast, slow = GuessNumber(), GuessNumber(step_latency_s=0.01, latency_sigma=0.5)
    for task_id in range(3):
        assert fast.reset(task_id) == slow.reset(task_id)
        for action in ("4", "x", "2", "6"):
            t0 = time.perf_counter()
            r = slow.step(action)
            assert time.perf_counter() - t0 >= slow.latency(task_id, r.info["turns"])
            assert fast.step(action) == r


@pytest.mark.parametrize(
    "kwargs",
    [{"step_latency_s": -1}, {"latency_sigma": float("nan")}, {"step_latency_s": "1"}, {"latency_sigma": True}],
)
def test_guess_number_rejects_a_bad_latency(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=f"guess_number: option {next(iter(kwargs))} must be a number >= 0"):
        GuessNumber(**kwargs)


@pytest.mark.parametrize(("low", "high"), [(1, 8), (1, 20), (-5, 5), (3, 3), (0, 100)])
def test_guess_number_expert_solves_within_bound(low: int, high: int) -> None:
    env = GuessNumber(low=low, high=high)
    bound = math.ceil(math.log2(high - low + 1)) + 1
    for task_id in range(300):
        results = play_expert(env, task_id)
        assert results[-1].done and results[-1].reward == 1.0, (low, high, task_id)
        assert len(results) <= bound, (low, high, task_id, len(results))


@pytest.mark.parametrize("action", ["", "four", "9", "0", "-1", "12", "1" * 5000, "+", "eight 8"[:5]])
def test_guess_number_invalid_action_is_a_turn(action: str) -> None:
    env = GuessNumber()
    env.reset(11)
    r = env.step(action)
    assert (r.observation, r.reward, r.done) == ("invalid, say a number from 1 to 8", 0.0, False)
    assert r.info["turns"] == 1
    assert env.step(action).info["turns"] == 2


def test_guess_number_corpus_covers_every_text() -> None:
    env = GuessNumber()
    seen = set()
    rng = random.Random(0)
    actions = [str(n) for n in range(-1, 11)] + ["", "what"]
    for task_id in range(60):
        seen.add(env.reset(task_id))
        seen.add(env.instructions())
        for _ in range(12):
            seen.add(env.step(rng.choice(actions)).observation)
    assert seen <= set(CORPUS), seen - set(CORPUS)
    assert {"correct", "higher", "lower"} <= seen
    assert {str(d) for d in range(10)} <= set(CORPUS)
    assert "guess a number from 2 to 30" in corpus(2, 30) and "30" in corpus(2, 30)


def test_guess_number_rejects_bad_options() -> None:
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['hihg'\]"):
        GuessNumber(hihg=9)
    with pytest.raises(ValueError, match="low=9 is greater than high=2"):
        GuessNumber(low=9, high=2)
    with pytest.raises(TypeError, match="high must be an integer, got '8'"):
        GuessNumber(high="8")  # type: ignore[arg-type]  # a wrong value on purpose: the error is what is tested


# ---------------------------------------------------------------- probe


def test_probe_echo_rewards_saying_the_observation_back_and_say_any_number() -> None:
    env = resolve_env("probe")(kind="echo")
    seen = set()
    for task_id in range(40):
        obs = env.reset(task_id)
        assert obs == env.expert_action() and 1 <= int(obs) <= 8
        seen.add(obs)
        wrong = str(int(obs) % 8 + 1)
        assert env.step(wrong) == StepResult("game over", 0.0, True, {"turns": 1, "success": False})
        assert env.step(obs).reward == 0.0  # one turn only: the episode is over
        env.reset(task_id)
        assert env.step(f"{obs}!") == StepResult("correct", 1.0, True, {"turns": 1, "success": True})
    assert len(seen) == 8  # the task ids cover the range
    say = resolve_env("probe")(kind="say", low=2, high=5)
    assert say.reset(3) == "guess a number from 2 to 5"
    assert say.step("4").reward == 1.0
    say.reset(3)
    assert say.step("9").reward == 0.0
    texts = {env.instructions(), "correct", "game over", say.reset(0)} | {env.reset(t) for t in range(40)}
    words = {w for t in CORPUS + corpus(2, 5) for w in t.split()}
    assert {w for t in texts for w in t.split()} <= words  # the quickstart's tokenizer knows every word


def test_probe_rejects_bad_options() -> None:
    probe = resolve_env("probe")
    with pytest.raises(ValueError, match=r"kind must be one of \['say', 'echo'\], got 'ecco'"):
        probe(kind="ecco")
    with pytest.raises(ValueError, match="low=9 is greater than high=2"):
        probe(low=9, high=2)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['hihg'\]"):
        probe(hihg=9)


# ---------------------------------------------------------------- chaos (the parts that run in-process)


def test_chaos_is_a_trivial_env_until_told_otherwise() -> None:
    env = Chaos(episode_len=2, raise_on_step=2, only_task=5)
    assert env.reset(1) == "chaos task 1"
    assert env.step("a") == StepResult("echo a", 0.0, False, {"steps": 1})
    assert env.step("b") == StepResult("echo b", 1.0, True, {"steps": 2, "success": True})
    env.reset(5)
    env.step("a")
    with pytest.raises(RuntimeError, match="raise_on_step=2 task=5"):
        env.step("b")
    with pytest.raises(RuntimeError, match="not running inside an env worker"):
        Chaos(garbage_on_step=0).reset(0)


# ---------------------------------------------------------------- registry


def test_registry_builtins_and_unknown_names() -> None:
    assert {"guess_number", "chaos"} <= set(known_envs())
    assert resolve_env("guess_number") is GuessNumber
    assert resolve_env("chaos") is Chaos
    with pytest.raises(UnknownEnvError) as err:
        resolve_env("guess_numbr")
    assert isinstance(err.value, ValueError)
    assert "'guess_numbr'" in str(err.value) and "guess_number" in str(err.value) and "chaos" in str(err.value)
    with pytest.raises(UnknownEnvError, match=r"'nope' \(from the config\)"):
        env_target("nope", "the config")


def test_register_env_checks_names_and_targets() -> None:
    register_env("guess_number", "agentgym.envpool.envs.guess_number:GuessNumber")  # same pair: no-op
    with pytest.raises(ValueError, match="already registered as"):
        register_env("guess_number", "agentgym.envpool.envs.chaos:Chaos")
    with pytest.raises(ValueError, match="'module.path:ClassName'"):
        register_env("x_env", "agentgym.envpool.envs.chaos.Chaos")
    with pytest.raises(ValueError, match="env name"):
        register_env("bad name", "a:B")
    with pytest.raises(TypeError, match="not a subclass of agentgym Env"):
        load_target("agentgym.envpool.envs.guess_number:corpus")
    with pytest.raises(ImportError, match="cannot import module 'agentgym.nothing_here'"):
        load_target("agentgym.nothing_here:Env")


# ---------------------------------------------------------------- env worker frames


ALL_MESSAGES = [
    Open(version=1, env="chaos", target="a.b:C", kwargs={"low": 1, "x": None, "s": "t", "f": 0.5, "b": True}),
    Reset(task_id=0),
    Reset(task_id=2**40),
    Step(action=""),
    Step(action="ünïcode ✓ " * 1000),
    Expert(),
    Close(),
    Ready(version=1, pid=123),
    Observation(text="higher"),
    Observation(text="", reward=-1.5, done=True, info={"success": True, "turns": 3, "x": 0.5}, instructions="i"),
    Action(text="4"),
    Failure(kind="env_error", message="RuntimeError: x", traceback="Traceback ..."),
]


@pytest.mark.parametrize("msg", ALL_MESSAGES, ids=lambda m: type(m).__name__)
def test_envworker_messages_round_trip(msg: msgspec.Struct) -> None:
    frame = pack_frame(msg)
    n = body_length(frame[:4])
    assert n == len(frame) - 4
    decode = decode_request if isinstance(msg, (Open, Reset, Step, Expert, Close)) else decode_reply
    assert decode(frame[4:]) == msg


def test_envworker_frames_refuse_oversize_and_garbage() -> None:
    with pytest.raises(FrameTooLarge, match=r"announces 4294967295 bytes .*more than the 8388608-byte limit"):
        body_length(b"\xff\xff\xff\xff")
    assert body_length(PREFIX.pack(MAX_FRAME_BYTES)) == MAX_FRAME_BYTES
    with pytest.raises(ProtocolError, match="prefix must be 4 bytes, got 3"):
        body_length(b"\x00\x00\x00")
    with pytest.raises(FrameTooLarge, match="Step: body of"):
        pack_frame(Step(action="x" * (MAX_FRAME_BYTES + 1)))
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        decode_reply(b"\xc1\xc1")
    enc = msgspec.msgpack.encode
    with pytest.raises(ProtocolError, match=r"task_id"):
        decode_request(enc({"type": "Reset", "task_id": "seven"}))
    with pytest.raises(ProtocolError, match=r"task_id"):
        decode_request(enc({"type": "Reset", "task_id": -1}))
    with pytest.raises(ProtocolError, match="Launch"):
        decode_request(enc({"type": "Launch"}))
    with pytest.raises(ProtocolError, match="extra"):
        decode_reply(enc({"type": "Action", "text": "4", "extra": 1}))
    # A request is not a reply: a worker echoing requests is caught.
    with pytest.raises(ProtocolError):
        decode_reply(pack_frame(Step(action="4"))[4:])
    with pytest.raises(ProtocolError, match=r"info"):
        decode_reply(enc({"type": "Observation", "text": "x", "info": {"k": [1, 2]}}))
