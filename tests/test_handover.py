"""Episode hand-over (actors/play/handover.py): an episode stopped at a turn boundary by one actor and
finished by another, with real engines (the reference engine on the tiny model), a real env pool
per actor (worker subprocesses) and the real conversation code.

  - the episode the learner gets is the first actor's tokens followed by the second actor's,
    bitwise (ids, logprobs, loss mask, versions, turn ends and rewards), and the second actor's
    first prompt is exactly the first actor's tokens;
  - every built-in env that says it is replayable reaches the same observations when its actions
    are replayed on a new instance of the same task, and one that reaches another observation is
    played again from the start.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from agentgym.actors.engines.engine import Generation, SamplingSpec  # noqa: E402
from agentgym.actors.engines.hf_engine import HfEngine  # noqa: E402
from agentgym.actors.play.rollout import Interrupted, play_episode  # noqa: E402
from agentgym.config import load_config  # noqa: E402
from agentgym.envpool.pool import EnvPool  # noqa: E402
from agentgym.envpool.registry import known_envs, resolve_env  # noqa: E402
from agentgym.models.tiny import make_default_tiny_model  # noqa: E402
from agentgym.protocol import Handover, Leave, PartialEpisode, RolloutSpec, Ticket, decode, encode  # noqa: E402
from agentgym.protocol.arrays import F32, I32, U8, unpack  # noqa: E402

SPEC = RolloutSpec(group_size=1, max_tokens_per_turn=6, max_episode_tokens=2048, temperature=1.0, top_p=1.0)
TICKET = Ticket(group_id="g0", env="guess_number", task_id=5)


class StoppingEngine(HfEngine):
    """The reference engine, recording each request's prompt and generation; with ``stop_after``
    it sets ``stop`` once that many generations have returned (an actor asked to leave)."""

    def __init__(self, *args, stop: asyncio.Event | None = None, stop_after: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stop, self.stop_after = stop, stop_after
        self.prompts: dict[str, list[int]] = {}
        self.seen: dict[str, Generation] = {}

    async def generate(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        self.prompts[request_id] = list(prompt_ids)
        gen = await super().generate(request_id, prompt_ids, spec)
        self.seen[request_id] = gen
        if self.stop is not None and len(self.seen) == self.stop_after:
            self.stop.set()
        return gen


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_default_tiny_model(tmp_path_factory.mktemp("handover") / "tiny", seed=0)


async def _with(engine: HfEngine, pool: EnvPool, coro_fn):
    await engine.start()
    await pool.start()
    try:
        return await coro_fn()
    finally:
        await pool.close()
        await engine.close()


def test_an_episode_stopped_and_finished_elsewhere_is_the_prefix_then_the_continuation(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    turns = 8

    async def run_first() -> PartialEpisode:
        stop = asyncio.Event()
        a = StoppingEngine(model_dir, seed=0, stop=stop, stop_after=3)
        pool = EnvPool("guess_number", {}, 1)

        async def go() -> PartialEpisode:
            try:
                await play_episode(a, tok, pool, TICKET, 0, SPEC, turns, stop=stop)
            except Interrupted as exc:
                return exc.partial
            raise AssertionError("the episode was not stopped")

        return await _with(a, pool, go)

    partial = asyncio.run(asyncio.wait_for(run_first(), 240))
    # It travels to the learner in a Leave and on to the next actor in its ticket.
    leave, _ = decode(
        encode(
            Leave(
                actor_id="a", reason="got SIGTERM", handovers=[Handover(group_id="g0", actor_id="a", partial=[partial])]
            )
        )
    )
    partial = leave.handovers[0].partial[0]
    assert len(partial.actions) == 3 and partial.turn_limit == turns

    b = StoppingEngine(model_dir, seed=1)
    pool_b = EnvPool("guess_number", {}, 1)
    ep = asyncio.run(
        asyncio.wait_for(
            _with(b, pool_b, lambda: play_episode(b, tok, pool_b, TICKET, 0, SPEC, turns, resume=partial)), 240
        )
    )

    n = len(partial.token_ids) // 4
    assert ep.resumed_at == n > 0
    # Bitwise: the first actor's arrays are the trained episode's first n items.
    assert ep.token_ids[: 4 * n] == partial.token_ids
    assert ep.logprobs[: 4 * n] == partial.logprobs
    assert ep.loss_mask[:n] == partial.loss_mask
    assert ep.versions[: 4 * n] == partial.versions
    assert ep.turn_ends[: len(partial.turn_ends)] == partial.turn_ends
    assert ep.turn_rewards[: len(partial.turn_rewards)] == partial.turn_rewards
    # The second actor continued from exactly those tokens, and what it sampled follows them.
    ids, logps, mask = unpack(ep.token_ids, I32), unpack(ep.logprobs, F32), unpack(ep.loss_mask, U8)
    first_rid = min(b.prompts, key=lambda r: int(r.rsplit("/", 1)[1]))
    assert first_rid == "g0/0/3" and b.prompts[first_rid] == unpack(partial.token_ids, I32).tolist()
    ends = unpack(ep.turn_ends, I32)
    for t, rid in enumerate(sorted(b.seen, key=lambda r: int(r.rsplit("/", 1)[1])), start=3):
        gen = b.seen[rid]
        span = slice(int(ends[t]) - len(gen.token_ids), int(ends[t]))
        assert ids[span].tolist() == list(gen.token_ids)
        assert np.array_equal(logps[span], np.asarray(gen.logprobs, dtype=np.float32))
        assert mask[span].all() and span.start >= n
    assert ep.num_turns > 3 or ep.finish == "done"


def _options(name: str) -> dict:
    """An adapter of another ecosystem's envs needs its options (which dataset, game or env id):
    its config's, configs/ecosystem/<name>.toml; the built-in envs play their defaults."""
    path = Path(__file__).resolve().parents[1] / "configs" / "ecosystem" / f"{name}.toml"
    return load_config(path, []).env.specs[0].kwargs if path.exists() else {}


def _play_and_replay(name: str, task: int, steps: int) -> tuple[list[str], list[str]]:
    cls = resolve_env(name)
    rng = random.Random(task)
    options = _options(name)
    env = cls(**options)
    obs, actions = [env.reset(task)], []
    for _ in range(steps):
        try:
            action = env.expert_action() if rng.random() < 0.5 else env.random_action(rng)
        except NotImplementedError:
            try:
                action = env.expert_action()
            except NotImplementedError:  # an adapter with neither: any text is an action to replay
                action = rng.choice(["1", "[0]", "move up", "42", "<answer>3</answer>"])
        actions.append(action)
        r = env.step(action)
        obs.append(r.observation)
        if r.done:
            break
    env.close()
    again = cls(**options)
    replayed = [again.reset(task)] + [again.step(a).observation for a in actions]
    again.close()
    return obs, replayed


CHEAP = [e for e in known_envs() if e not in ("sciworld", "webshop", "remote", "chaos")]


@pytest.mark.parametrize("name", CHEAP)
def test_replayable_envs_reach_the_same_observations_when_replayed(name: str) -> None:
    cls = resolve_env(name)
    if not cls.replayable:
        pytest.skip(f"{name} says it is not replayable")
    for task in (0, 7, 123):
        obs, replayed = _play_and_replay(name, task, steps=6)
        assert replayed == obs, (name, task)


def test_envs_whose_state_lives_elsewhere_say_so() -> None:
    assert not resolve_env("remote").replayable and not resolve_env("chaos").replayable


def test_a_replay_that_reaches_another_observation_plays_the_episode_again(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    b = StoppingEngine(model_dir, seed=1)
    pool = EnvPool("guess_number", {}, 1)
    wrong = PartialEpisode(
        token_ids=b"\x01\x00\x00\x00",
        logprobs=b"\x00" * 4,
        loss_mask=b"\x00",
        versions=b"\xff" * 4,
        turn_ends=b"",
        turn_rewards=b"",
        actions=[],
        observation_sha256="0" * 64,
        turn_limit=3,
    )
    ep = asyncio.run(
        asyncio.wait_for(_with(b, pool, lambda: play_episode(b, tok, pool, TICKET, 0, SPEC, 3, resume=wrong)), 240)
    )
    # Played from its first turn: the first request is turn 0's, its prompt the env's first observation.
    assert ep.resumed_at == 0 and ep.num_turns >= 1 and min(b.prompts) == "g0/0/0"
    assert b.prompts["g0/0/0"] == unpack(ep.token_ids, I32)[: len(b.prompts["g0/0/0"])].tolist()
