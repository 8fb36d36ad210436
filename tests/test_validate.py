"""A learner no peer can crash or fool, without sockets (learner/control/validate.py, Learner.on_rollout):

- hypothesis: ``protocol.decode`` raises nothing but ProtocolError on arbitrary frames;
- hypothesis: any mutation of a valid rollout, sent as bytes, is refused by decoding or judged
  without an exception; what is accepted is trainable (collates, ids inside the vocabulary), what
  is invalid is counted under a reason;
- the legitimate cases of ticket ownership: a re-queued ticket's late first answer, another
  actor's ticket, a resumed learner, an evaluation ticket with bad content.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from learner_fixtures import GOOD, PROMPTS, episode, make_cfg

from agentgym.learner.control.validate import vocab_size
from agentgym.learner.service import Learner
from agentgym.learner.training.batch import collate
from agentgym.protocol import Ack, ProtocolError, Rollout, Ticket, decode, encode
from agentgym.protocol.arrays import F32, I32, U8, pack, unpack
from agentgym.protocol.wire import MAGIC, PROTOCOL_VERSION

GROUP = 2
ids = itertools.count()


@pytest.fixture(scope="module")
def tiny_model(fallback_model: Path) -> Path:
    return fallback_model  # tests/conftest.py


class Acks:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, object]] = []

    def send(self, peer: bytes, msg: object) -> None:
        self.sent.append((peer, msg))

    def ack(self, peer: bytes, group_id: str, status: str) -> None:
        self.sent.append((peer, Ack(group_ids=[group_id], statuses=[status])))  # type: ignore[list-item]  # the recording stand-in's own list

    def last_status(self) -> str:
        msg = self.sent[-1][1]
        assert isinstance(msg, Ack)
        return msg.statuses[0]


def make_learner(model: Path, run_dir: Path, *overrides: str) -> Learner:
    cfg = make_cfg(model, f"rollout.group_size={GROUP}", "learner.max_staleness=8", *overrides)
    ln = Learner(cfg, run_dir, trainer=None, hub=Acks())
    ln.step = ln.curriculum.step = 3  # as after three trained steps
    return ln


def ticket(env: str = "guess_number", task: int = 5) -> Ticket:
    return Ticket(group_id=f"t{next(ids)}", env=env, task_id=task)


def rollout_for(t: Ticket, actor: str = "a", version: int = 3) -> Rollout:
    eps = [episode(PROMPTS[i % 2], [[GOOD]], [1.0], version=version, behav=[-0.5]) for i in range(GROUP)]
    return Rollout(group_id=t.group_id, actor_id=actor, env=t.env, task_id=t.task_id, episodes=eps)


# ---------------------------------------------------------------- decoding arbitrary frames

frame = st.binary(max_size=300)
header = st.builds(lambda v, k: MAGIC + bytes((v, k)), st.integers(0, 255), st.integers(0, 255))
valid_header = st.builds(lambda k: MAGIC + bytes((PROTOCOL_VERSION, k)), st.integers(0, 20))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(frame, header, valid_header), max_size=4)
    | st.tuples(valid_header, frame).map(list)
    | st.tuples(valid_header, frame, frame).map(list)
)
def test_decode_raises_only_protocol_errors_on_arbitrary_frames(frames: list[bytes]) -> None:
    try:
        decode(frames)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_decode_raises_only_protocol_errors_on_corrupted_valid_messages(data: st.DataObject) -> None:
    frames = [bytes(f) for f in encode(rollout_for(Ticket(group_id="g", env="guess_number", task_id=5)))]
    body = bytearray(frames[1])
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(body) - 1, 0)))
        if op == "flip" and body:
            body[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del body[at:]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    try:
        decode([frames[0], bytes(body)])
    except ProtocolError:
        pass


# ---------------------------------------------------------------- judging mutated rollouts

F = ["token_ids", "logprobs", "loss_mask", "versions", "turn_ends", "turn_rewards"]
DTYPE = dict(zip(F, [I32, F32, U8, I32, I32, F32], strict=True))
odd_floats = st.sampled_from([math.nan, math.inf, -math.inf, 1e30, 0.5, -1e-3, 0.0])


@st.composite
def mutation(draw: st.DrawFn) -> tuple[str, object]:
    kind = draw(st.sampled_from(["array", "value", "scalar", "meta", "episodes"]))
    if kind == "array":
        name = draw(st.sampled_from(F))
        n = draw(st.integers(0, 30))
        if DTYPE[name] is F32:
            vals = draw(st.lists(odd_floats | st.floats(-50, 50), min_size=n, max_size=n))
        elif DTYPE[name] is U8:
            vals = draw(st.lists(st.integers(0, 255), min_size=n, max_size=n))
        else:
            vals = draw(st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(-3, 300), min_size=n, max_size=n))
        return kind, (name, pack(np.array(vals), DTYPE[name]))
    if kind == "value":  # one item of one array, same length
        name = draw(st.sampled_from(F))
        v = draw(
            odd_floats if DTYPE[name] is F32 else st.integers(0, 255) if DTYPE[name] is U8 else st.integers(-5, 400)
        )
        return kind, (name, draw(st.integers(0, 20)), v)
    if kind == "scalar":
        return kind, (
            draw(st.sampled_from(["reward", "turn_limit", "finish", "success"])),
            draw(odd_floats | st.integers(-2, 3) | st.sampled_from(["done", "aborted", "x"]) | st.booleans()),
        )
    if kind == "meta":
        return kind, (
            draw(st.sampled_from(["env", "task_id", "actor_id", "group_id"])),
            draw(st.sampled_from(["maze", "b", "", "t0"]) | st.integers(0, 9)),
        )
    return kind, draw(st.sampled_from(["drop", "dup", "empty"]))


def apply(d: dict, m: tuple[str, object], ep: int) -> None:
    kind, arg = m
    e = d["episodes"][ep % len(d["episodes"])] if d["episodes"] else None
    if kind == "array" and e is not None:
        name, data = arg  # type: ignore[misc]  # arg is a tuple of this case's shape
        e[name] = data
    elif kind == "value" and e is not None:
        name, i, v = arg  # type: ignore[misc]  # arg is a tuple of this case's shape
        a = unpack(e[name], DTYPE[name]).copy()
        if a.size:
            a[i % a.size] = v
            e[name] = pack(a, DTYPE[name])
    elif kind == "scalar" and e is not None:
        name, v = arg  # type: ignore[misc]  # arg is a tuple of this case's shape
        e[name] = v
    elif kind == "meta":
        name, v = arg  # type: ignore[misc]  # arg is a tuple of this case's shape
        d[name] = v
    elif kind == "episodes":
        d["episodes"] = {"drop": d["episodes"][1:], "dup": d["episodes"] * 2, "empty": []}[arg]  # type: ignore[index]  # arg is one of these keys


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(muts=st.lists(st.tuples(mutation(), st.integers(0, 3)), min_size=1, max_size=4))
def test_any_mutated_rollout_is_refused_or_judged_never_an_exception(
    tiny_model: Path, tmp_path: Path, muts: list
) -> None:
    ln = make_learner(tiny_model, tmp_path)
    t = ticket()
    ln.control.guard.issue("a", [t])
    d = msgspec.msgpack.decode(encode(rollout_for(t))[1])  # the wire form as plain dicts
    for m, ep in muts:
        apply(d, m, ep)
    frames = [encode(rollout_for(t))[0], msgspec.msgpack.encode(d)]
    try:
        r, _ = decode(frames)
    except ProtocolError:
        return  # refused by the protocol layer: it never reaches the learner
    before = sum(ln.control.guard.invalid.values())
    ln.control.on_rollout(b"a", r)
    status = ln.hub.last_status()
    if status == "invalid":
        assert sum(ln.control.guard.invalid.values()) == before + 1  # counted under a reason
    elif status == "accepted":
        vocab = vocab_size(tiny_model)
        assert vocab is not None
        for e in r.episodes:  # type: ignore[attr-defined]  # a Rollout the test built
            tok, mask = unpack(e.token_ids, I32), unpack(e.loss_mask, U8)
            assert tok.size == 0 or (tok.min() >= 0 and tok.max() < vocab)
            assert set(np.unique(mask).tolist()) <= {0, 1}
            assert np.isfinite(unpack(e.logprobs, F32)).all() and math.isfinite(e.reward)
        collate([r], pad_id=0)  # type: ignore[list-item]  # what the trainer does first: no error
        assert any(b is r for b in ln.buffer)
    else:
        assert status in ("stale", "failed", "duplicate"), status


# ---------------------------------------------------------------- tickets: the legitimate cases


def test_a_valid_rollout_is_accepted_and_every_kind_of_bad_one_is_invalid_with_its_reason(
    tiny_model: Path, tmp_path: Path
) -> None:
    ln = make_learner(tiny_model, tmp_path)

    def send(mutate, actor: str = "a", issue_to: str = "a") -> str:
        t = ticket()
        ln.control.guard.issue(issue_to, [t])
        r = rollout_for(t, actor)
        r = mutate(r, t) or r
        ln.control.on_rollout(actor.encode(), r)
        return ln.hub.last_status()

    def ep0(r: Rollout, **kw: object) -> Rollout:
        return msgspec.structs.replace(r, episodes=[msgspec.structs.replace(r.episodes[0], **kw), *r.episodes[1:]])

    assert send(lambda r, t: None) == "accepted"
    n = 11  # agent token at index len(PROMPTS[0]) = 8; 11 tokens in all
    cases = {
        "unknown_ticket": lambda r, t: msgspec.structs.replace(r, group_id="nobody-issued-this"),
        "env_mismatch": lambda r, t: msgspec.structs.replace(r, env="maze"),
        "task_mismatch": lambda r, t: msgspec.structs.replace(r, task_id=t.task_id + 1),
        "group_size": lambda r, t: msgspec.structs.replace(r, episodes=r.episodes[:1]),
        "token_out_of_vocab": lambda r, t: ep0(r, token_ids=pack([*range(10), ln.control.guard.vocab_size], I32)),
        "too_many_tokens": lambda r, t: ep0(
            r,
            token_ids=pack([1] * 65, I32),
            logprobs=pack([0.0] * 65, F32),
            loss_mask=pack([0] * 65, U8),
            versions=pack([-1] * 65, I32),
        ),
        "loss_mask_not_0_1": lambda r, t: ep0(r, loss_mask=pack([0] * 8 + [2] + [0] * 2, U8)),
        "versions_inconsistent_with_mask": lambda r, t: ep0(r, versions=pack([0] * n, I32)),
        "logprob_not_finite_or_positive": lambda r, t: ep0(r, logprobs=pack([0.0] * 8 + [0.7] + [0.0] * 2, F32)),
        "reward_not_finite": lambda r, t: ep0(r, reward=math.nan),
        "turn_ends_out_of_order_or_range": lambda r, t: ep0(r, turn_ends=pack([n + 1], I32)),
    }
    for reason, mutate in cases.items():
        assert send(mutate) == "invalid", reason
        assert ln.control.guard.invalid[reason] == 1, (reason, dict(ln.control.guard.invalid))
    assert send(lambda r, t: None, actor="b", issue_to="a") == "invalid"  # another actor's ticket
    assert ln.control.guard.invalid["not_this_actors_ticket"] == 1
    assert len(ln.buffer) == 1 and ln.counters.groups["invalid"] == len(cases) + 1
    assert ln.control.guard.metrics()["invalid/env_mismatch"] == 1


def test_a_stolen_ticket_stays_open_for_its_holder_and_a_requeued_tickets_late_answer_counts(
    tiny_model: Path, tmp_path: Path
) -> None:
    ln = make_learner(tiny_model, tmp_path)
    t = ticket()
    ln.control.guard.issue("a", [t])
    ln.control.on_rollout(b"evil", rollout_for(t, "evil"))  # an impostor answers a's ticket first
    assert ln.hub.last_status() == "invalid" and t.group_id not in ln.control.seen
    ln.control.guard.issue("b", [t])  # a presumed dead: its ticket re-queued and granted to b
    ln.control.on_rollout(b"a", rollout_for(t, "a"))  # a's late rollout still counts
    assert ln.hub.last_status() == "accepted"
    ln.control.on_rollout(b"b", rollout_for(t, "b"))  # b's copy comes second
    assert ln.hub.last_status() == "duplicate"
    ln.control.on_rollout(b"a", rollout_for(t, "a"))  # a replay
    assert ln.hub.last_status() == "duplicate" and len(ln.buffer) == 1


def test_tickets_open_at_a_checkpoint_are_admitted_after_a_resume(tiny_model: Path, tmp_path: Path) -> None:
    ln = make_learner(tiny_model, tmp_path)
    done, pending = ticket(), ticket(env="guess_number", task=9)
    ln.control.guard.issue("a", [done, pending])
    ln.control.on_rollout(b"a", rollout_for(done))
    state = msgspec.json.decode(msgspec.json.encode(ln.checkpoint_state()))  # as the checkpoint stores it
    resumed = make_learner(tiny_model, tmp_path / "resumed")
    resumed.trainer = type("T", (), {"step": 3})()  # only its step is read
    resumed.restore(state)
    resumed.control.on_rollout(b"a", rollout_for(done))
    assert resumed.hub.last_status() == "duplicate"
    resumed.control.on_rollout(b"b", rollout_for(pending, "b"))
    assert resumed.hub.last_status() == "invalid"  # still a's, not b's
    resumed.control.on_rollout(b"a", rollout_for(pending))
    assert resumed.hub.last_status() == "accepted"


def test_an_eval_ticket_with_bad_content_completes_its_round_without_episodes(tiny_model: Path, tmp_path: Path) -> None:
    ln = make_learner(tiny_model, tmp_path, "eval.tasks=1")
    rnd = ln.start_eval()
    (t,) = [t for batch in ln.sched.fill(ln.version).values() for t in batch] or [ln.sched.eval_queue[0]]
    ln.control.guard.issue("a", [t])
    bad = rollout_for(t)
    bad = msgspec.structs.replace(bad, episodes=[msgspec.structs.replace(e, reward=math.inf) for e in bad.episodes])
    ln.control.on_rollout(b"a", bad)
    assert ln.hub.last_status() == "invalid" and rnd.done.is_set()
    assert ln.evals.results[-1]["episodes"] == 0


# ---------------------------------------------------------------- learner.filter_groups (dynamic sampling)


def filtering_learner(model: Path, run_dir: Path, mode: str, batch_groups: int):
    """A learner with ``learner.filter_groups = mode`` and a ``send(rewards)`` that plays one of its
    tickets with those rewards (a positive reward is a success) and returns the ack's status."""
    cfg = make_cfg(
        model,
        f"rollout.group_size={GROUP}",
        "learner.max_staleness=8",
        f'learner.filter_groups="{mode}"',
        f"learner.batch_groups={batch_groups}",
    )
    ln = Learner(cfg, run_dir, trainer=None, hub=Acks())
    ln.step = ln.curriculum.step = 3
    n = itertools.count()

    def send(rewards: list[float]) -> str:
        t = Ticket(group_id=f"{ln.sched.run_id}:{next(n)}", env="guess_number", task_id=5)
        ln.ledger.issued([t])
        ln.control.guard.issue("a", [t])
        eps = [episode(PROMPTS[i % 2], [[GOOD]], [rw], version=3, behav=[-0.5]) for i, rw in enumerate(rewards)]
        ln.control.on_rollout(
            b"a", Rollout(group_id=t.group_id, actor_id="a", env=t.env, task_id=t.task_id, episodes=eps)
        )
        return ln.hub.last_status()

    return ln, send


def test_filter_groups_plays_but_never_trains_an_all_equal_group_and_frees_its_place(
    tiny_model: Path, tmp_path: Path
) -> None:
    from agentgym.learner.control.group_filter import STREAK_LIMIT

    B = 2
    ln, send = filtering_learner(tiny_model, tmp_path, "equal", B)
    assert send([1.0, 1.0]) == "filtered" and send([0.0, 0.0]) == "filtered"
    assert send([1.0, 0.0]) == "accepted"
    assert len(ln.buffer) == 1 and ln.counters.groups["filtered"] == 2 and ln.counters.episodes["filtered"] == 2 * GROUP
    assert ln.sched.forfeited == 2  # their places under the staleness bound went to new tickets
    assert sorted(ln.ledger.fate.values()) == ["accepted", "filtered", "filtered"]
    assert ln.ledger.summary([r.group_id for r in ln.buffer], [])["unaccounted"] == 0
    # A solved task never stalls the run: after STREAK_LIMIT batches' worth in a row, one is trained.
    statuses = [send([1.0, 1.0]) for _ in range(STREAK_LIMIT * B + 1)]
    assert statuses == ["filtered"] * (STREAK_LIMIT * B) + ["accepted"]
    assert send([1.0, 1.0]) == "filtered"  # and the streak starts over

    # Off (the default): the same group is accepted.
    plain = make_learner(tiny_model, tmp_path / "plain")
    t = ticket()
    plain.control.guard.issue("a", [t])
    plain.control.on_rollout(b"a", rollout_for(t))  # every episode rewarded 1.0
    assert plain.hub.last_status() == "accepted"


def test_filter_groups_solved_filters_all_solved_groups_and_trains_all_failed_ones(
    tiny_model: Path, tmp_path: Path
) -> None:
    ln, send = filtering_learner(tiny_model, tmp_path, "solved", 2)
    assert send([0.0, 0.0]) == "accepted"  # all failed: advantage 0, but its KL term still pulls
    assert send([1.0, 1.0]) == "filtered"
    assert send([1.0, 0.0]) == "accepted"
    assert ln.counters.groups["filtered"] == 1 and len(ln.buffer) == 2 and ln.sched.forfeited == 1


def test_filter_groups_with_an_estimator_that_is_not_group_relative_is_refused_by_name(tiny_model: Path) -> None:
    from agentgym.config import ConfigError

    for algo in ("ppo", "reinforce_pp"):
        with pytest.raises(ConfigError, match=f"learner.filter_groups needs .* not '{algo}'"):
            make_cfg(tiny_model, 'learner.filter_groups="solved"', f'learner.algorithm="{algo}"')
        assert make_cfg(tiny_model, f'learner.algorithm="{algo}"').learner.filter_groups == "off"  # the default
    assert (
        make_cfg(tiny_model, 'learner.filter_groups="equal"', 'learner.algorithm="rloo"').learner.filter_groups
        == "equal"
    )
    with pytest.raises(ConfigError, match="filter_groups"):
        make_cfg(tiny_model, "learner.filter_groups=true")  # the mode is named, not a switch
