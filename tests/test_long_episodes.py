"""An episode that would pass the engine's context or the token budget ends as a token_limit
truncation: a huge observation (first or later) never crashes an actor. Real env pool (the
``chaos`` env's ``huge_on_step``), real engine (transformers), the real rollout code."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentgym.actors.engines.builders import context_length, make_engine  # noqa: E402
from agentgym.actors.play.rollout import play_episode  # noqa: E402
from agentgym.config import load_config  # noqa: E402
from agentgym.envpool.pool import EnvPool  # noqa: E402
from agentgym.models.tiny import make_default_tiny_model  # noqa: E402
from agentgym.protocol import RolloutSpec, Ticket  # noqa: E402
from agentgym.protocol.arrays import I32, U8, unpack  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_default_tiny_model(tmp_path_factory.mktemp("long") / "tiny", seed=0)


def test_context_length_is_the_models_positions_capped_by_the_episode_budget(model_dir: Path) -> None:
    cfg = load_config(None, ["rollout.max_episode_tokens=100000"])
    assert context_length(cfg, model_dir) == 2048  # the tiny model's max_position_embeddings
    assert context_length(load_config(None, ["rollout.max_episode_tokens=300"]), model_dir) == 300
    assert context_length(load_config(None, ["actor.max_model_len=128"]), model_dir) == 128


@pytest.mark.parametrize("huge_on_step", [0, 2])  # the first observation, a later one
def test_a_huge_observation_ends_the_episode_as_a_token_limit_truncation(model_dir: Path, huge_on_step: int) -> None:
    from transformers import AutoTokenizer

    # The engine's context (128) is below the episode budget (4096): the engine's limit binds.
    cfg = load_config(None, ['actor.engine="hf"', "actor.max_model_len=128", "rollout.max_episode_tokens=4096"])
    tok = AutoTokenizer.from_pretrained(model_dir)
    spec = RolloutSpec(group_size=2, max_tokens_per_turn=8, max_episode_tokens=4096, temperature=1.0, top_p=1.0)

    async def go():
        engine = make_engine(cfg, model_dir)
        pool = EnvPool("chaos", {"huge_on_step": huge_on_step, "episode_len": 50, "huge_chars": 2_000_000}, 2)
        await engine.start()
        await pool.start()
        try:
            ticket = Ticket(group_id="g0", env="chaos", task_id=1)
            return await asyncio.gather(
                *(play_episode(engine, tok, pool, ticket, i, spec, 20, seed=i) for i in range(2))
            )
        finally:
            await pool.close()
            await engine.close()

    for ep in asyncio.run(asyncio.wait_for(go(), 120)):
        ids, mask = unpack(ep.token_ids, I32), unpack(ep.loss_mask, U8)
        assert ep.finish == "token_limit", (ep.finish, ep.failure)
        assert 0 < len(ids) <= 128
        assert int(mask.sum()) > 0 if huge_on_step else int(mask.sum()) == 0  # agent turns before the huge one
