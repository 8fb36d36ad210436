"""Episodes as the learner receives them: engine + conversation + a real environment pool.

A real ``guess_number`` pool (worker subprocesses) and the reference engine play episodes;
the checks are on the ``Episode`` message the actor sends: its token list holds every sampled
token exactly, the learner's recomputation of the agent tokens' logprobs over that token list
matches the behaviour logprobs, and the per-turn and per-episode token budgets cut episodes
with a clear reason.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from agentgym.actors.engines.engine import Generation, SamplingSpec  # noqa: E402
from agentgym.actors.engines.hf_engine import HfEngine  # noqa: E402
from agentgym.actors.play.rollout import play_episode  # noqa: E402
from agentgym.envpool.pool import EnvPool  # noqa: E402
from agentgym.learner.model.logprobs import sequence_logprobs  # noqa: E402
from agentgym.models.tiny import make_default_tiny_model  # noqa: E402
from agentgym.protocol import RolloutSpec, Ticket  # noqa: E402
from agentgym.protocol.arrays import F32, I32, U8, unpack  # noqa: E402
from agentgym.protocol.vocab import banned_action_ids  # noqa: E402


class RecordingEngine(HfEngine):
    """The reference engine, keeping every generation it returns (to compare with the episode)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[str, Generation] = {}

    async def generate(self, request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> Generation:
        gen = await super().generate(request_id, prompt_ids, spec)
        self.seen[request_id] = gen
        return gen


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = make_default_tiny_model(tmp_path_factory.mktemp("rollout") / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model_dir, tok, model


def play(model_dir: Path, tok, spec: RolloutSpec, n: int, turn_limit: int):
    async def go():
        engine = RecordingEngine(model_dir, seed=0)
        pool = EnvPool("guess_number", {}, n)
        await engine.start()
        await pool.start()
        try:
            ticket = Ticket(group_id="g0", env="guess_number", task_id=3)
            eps = await asyncio.gather(
                *(play_episode(engine, tok, pool, ticket, i, spec, turn_limit, seed=i) for i in range(n))
            )
            return eps, engine.seen
        finally:
            await pool.close()
            await engine.close()

    return asyncio.run(asyncio.wait_for(go(), 240))


def arrays(ep):
    return (
        unpack(ep.token_ids, I32),
        unpack(ep.logprobs, F32),
        unpack(ep.loss_mask, U8),
        unpack(ep.versions, I32),
        unpack(ep.turn_ends, I32),
    )


def test_episode_tokens_are_the_sampled_ones_and_the_learner_agrees(setup) -> None:
    model_dir, tok, model = setup
    spec = RolloutSpec(group_size=3, max_tokens_per_turn=6, max_episode_tokens=1024, temperature=1.0, top_p=1.0)
    episodes, seen = play(model_dir, tok, spec, 3, turn_limit=4)
    banned = torch.tensor(banned_action_ids(tok), dtype=torch.long)
    diffs = []
    for i, ep in enumerate(episodes):
        ids, lps, mask, vers, turn_ends = arrays(ep)
        assert ep.finish in ("done", "turn_limit") and ep.num_turns == len(turn_ends) >= 1
        gens = [seen[f"g0/{i}/{t}"] for t in range(ep.num_turns)]
        # The mask-1 tokens are exactly the sampled tokens of each turn, in order, nothing else.
        assert ids[mask == 1].tolist() == [t for g in gens for t in g.token_ids]
        assert lps[mask == 1].tolist() == pytest.approx([x for g in gens for x in g.logprobs], abs=1e-6)
        assert (vers[mask == 1] == 0).all() and (vers[mask == 0] == -1).all()
        for g, end in zip(gens, turn_ends):
            assert ids[end - len(g.token_ids) : end].tolist() == g.token_ids
        # What the learner computes on this very token list gives back the behaviour logprobs.
        t = torch.tensor(ids, dtype=torch.long)[None]
        with torch.no_grad():
            ref = sequence_logprobs(model, t, torch.ones_like(t), spec.temperature, banned=banned)[0].numpy()
        diffs.append(np.abs(ref[mask == 1] - lps[mask == 1]))
        # No action holds a special token other than EOS (protocol/vocab.py).
        assert not set(ids[mask == 1].tolist()) & set(banned_action_ids(tok))
    d = np.concatenate(diffs)
    print(f"\nepisode logprob parity hf vs learner: max={d.max():.3g} mean={d.mean():.3g} n={d.size}")
    assert d.max() < 1e-3


def test_token_budgets_truncate_with_a_reason(setup) -> None:
    model_dir, tok, _ = setup
    per_turn = RolloutSpec(group_size=2, max_tokens_per_turn=2, max_episode_tokens=1024, temperature=1.0, top_p=1.0)
    episodes, seen = play(model_dir, tok, per_turn, 2, turn_limit=3)
    for i, ep in enumerate(episodes):
        ids, _, mask, _, turn_ends = arrays(ep)
        for t, end in enumerate(turn_ends):
            g = seen[f"g0/{i}/{t}"]
            assert len(g.token_ids) <= 2
            if g.finish_reason == "length":  # cut by the turn budget: the closing is not the agent's
                assert mask[end] == 0
        assert ep.finish in ("done", "turn_limit")
        assert ep.truncated == (ep.finish == "turn_limit")
    # At the turn limit the episode ends in the state the agent would act in next: after the last
    # turn's closing, the last observation and the generation prompt (masked), where PPO reads
    # its bootstrap value.
    msgs = [{"role": "user", "content": "x"}]
    with_prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    gen_prompt = tok.encode(with_prompt[len(tok.apply_chat_template(msgs, tokenize=False)) :], add_special_tokens=False)
    cut = [(i, ep) for i, ep in enumerate(episodes) if ep.finish == "turn_limit"]
    assert cut, "a random tiny model guesses the number within 3 turns: no turn-limit episode to check"
    for _, ep in cut:
        ids, _, mask, _, turn_ends = arrays(ep)
        tail = ids[turn_ends[-1] :]
        assert not mask[turn_ends[-1] :].any() and tail[-len(gen_prompt) :].tolist() == gen_prompt
        text = tok.decode(tail, skip_special_tokens=True)
        assert any(w in text.lower() for w in ("higher", "lower", "invalid", "not a")), text

    budget = 120
    per_episode = RolloutSpec(
        group_size=2, max_tokens_per_turn=16, max_episode_tokens=budget, temperature=1.0, top_p=1.0
    )
    episodes, _ = play(model_dir, tok, per_episode, 2, turn_limit=50)
    for ep in episodes:
        if ep.finish == "done":  # guessed right before the budget ran out: nothing to check
            continue
        assert ep.finish == "token_limit" and ep.truncated
        assert ep.num_tokens <= budget
        assert ep.num_turns >= 1
