"""Bring your own agent: an unmodified ``openai.OpenAI`` agent plays through the actor's endpoint.

Real pieces: the aiohttp endpoint on loopback, the ``openai`` SDK in the agent's thread (or the
agent as a subprocess), the reference engine (``hf``) on the tiny model, the learner's collate,
guard and logprob recomputation. Checks: the tokens the learner trains are bitwise the tokens the
engine was given and generated; an agent that rewrites its history gets segments, each the exact
sequence one engine call saw, each trained with the right logprobs; crashes, hangs, limits and
tokens end one episode each, as counted.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from engine_fixtures import RecordingEngine  # noqa: E402

from agentgym.actors.engines.engine import SamplingSpec  # noqa: E402
from agentgym.actors.engines.hf_engine import HfEngine  # noqa: E402
from agentgym.actors.play.agent_runner import AgentRunner  # noqa: E402
from agentgym.config.actor import AgentEndpointConfig  # noqa: E402
from agentgym.learner.control.validate import Guard  # noqa: E402
from agentgym.learner.model.logprobs import sequence_logprobs  # noqa: E402
from agentgym.learner.training.batch import collate, segments  # noqa: E402
from agentgym.models.tiny import make_default_tiny_model  # noqa: E402
from agentgym.protocol import Rollout, RolloutSpec, Ticket  # noqa: E402
from agentgym.protocol.arrays import F32, I32, U8, unpack  # noqa: E402
from agentgym.protocol.vocab import banned_action_ids  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "examples" / "guess_number_agent.py")
SPEC = RolloutSpec(
    group_size=4,
    max_tokens_per_turn=3,
    max_episode_tokens=512,
    temperature=1.0,
    top_p=1.0,
    env_kwargs={"guess_number": {"low": 1, "high": 8}},
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = make_default_tiny_model(tmp_path_factory.mktemp("agent") / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model_dir, tok, model


def play(
    model_dir: Path,
    tok,
    cfg: AgentEndpointConfig,
    turn_limit: int = 4,
    n: int = 4,
    spec: RolloutSpec = SPEC,
    split: str = "train",
):
    async def go():
        engine = RecordingEngine(model_dir, seed=0)
        await engine.start()
        stats: dict[str, int] = {}
        runner = AgentRunner(cfg, engine, tok, stats)
        await runner.start()
        try:
            ticket = Ticket(group_id="g0", env="guess_number", task_id=3, split=split)
            eps = await asyncio.gather(*(runner.play(ticket, i, spec, turn_limit) for i in range(n)))
            return eps, engine.seen, stats
        finally:
            await runner.close()
            await engine.close()

    return asyncio.run(asyncio.wait_for(go(), 240))


def learner_logprobs(model, ids: np.ndarray, tok) -> np.ndarray:
    """The learner's logprobs: the policy without the special tokens (protocol/vocab.py)."""
    t = torch.tensor(ids, dtype=torch.long)[None]
    banned = torch.tensor(banned_action_ids(tok), dtype=torch.long)
    with torch.no_grad():
        return sequence_logprobs(model, t, torch.ones_like(t), 1.0, banned=banned)[0].numpy()


def test_an_openai_sdk_agent_trains_exactly_the_engines_tokens(setup) -> None:
    model_dir, tok, model = setup
    episodes, seen, stats = play(model_dir, tok, AgentEndpointConfig(enabled=True, program=f"{EXAMPLE}:play"))
    by_prompt = {tuple(p): g for p, g in seen}
    assert stats["agent_calls"] == len(seen) and stats["agent_prefix_breaks"] == 0 and not stats.get("agent_failures")
    batch = collate(
        [Rollout(group_id="g0", actor_id="a", env="guess_number", task_id=3, episodes=episodes)], tok.pad_token_id or 0
    )
    assert (
        Guard(group_size=4, max_episode_tokens=512, vocab_size=None).content(
            Rollout(group_id="g0", actor_id="a", env="guess_number", task_id=3, episodes=episodes)
        )
        is None
    )
    for row, ep in enumerate(episodes):
        assert ep.finish in ("done", "turn_limit") and ep.prefix_breaks == 0 and ep.segment_ends == b""
        ids, lps, mask = unpack(ep.token_ids, I32), unpack(ep.logprobs, F32), unpack(ep.loss_mask, U8)
        vers, ends = unpack(ep.versions, I32), unpack(ep.turn_ends, I32)
        # Each call: the engine was given exactly the episode's tokens before it, and generated
        # exactly the tokens that follow, with these logprobs and versions (bitwise).
        start = 0
        agent_ids, agent_lps = [], []
        for end in ends:
            gen = next(
                g
                for p, g in seen
                if len(p) == end - len(g.token_ids)
                and p == ids[: len(p)].tolist()
                and ids[len(p) : end].tolist() == g.token_ids
            )
            assert tuple(ids[: end - len(gen.token_ids)].tolist()) in by_prompt
            assert (mask[end - len(gen.token_ids) : end] == 1).all() and not mask[
                start : end - len(gen.token_ids)
            ].any()
            assert np.array_equal(lps[end - len(gen.token_ids) : end], np.asarray(gen.logprobs, dtype=np.float32))
            assert vers[end - len(gen.token_ids) : end].tolist() == gen.versions
            agent_ids += gen.token_ids
            agent_lps += gen.logprobs
            start = end
        assert ids[mask == 1].tolist() == agent_ids and len(ids) == ends[-1]
        # The learner's batch row is the same tokens, and recomputes the same logprobs.
        n = int(batch.lengths[row])
        assert batch.input_ids[row, :n].tolist() == ids.tolist() and batch.loss_mask[row, :n].tolist() == mask.tolist()
        ref = learner_logprobs(model, ids, tok)
        assert np.abs(ref[mask == 1] - lps[mask == 1]).max() < 1e-3
    assert any(ep.num_turns > 1 for ep in episodes), "no multi-call episode: nothing shows the prefix extension"


REWRITER = textwrap.dedent('''
    def play(task, client):
        """Keeps only the last observation: every call after the first rewrites the history."""
        msgs = [{"role": "user", "content": "guess a number from 1 to 8"}]
        for _ in range(task["max_calls"]):
            text = client.chat.completions.create(model="m", messages=msgs, max_tokens=3).choices[0].message.content
            msgs = [{"role": "user", "content": "lower"}]
        return {"reward": 0.5, "success": False}
''')


def test_a_history_rewriting_agent_is_split_and_each_segment_trains_correctly(setup, tmp_path: Path) -> None:
    model_dir, tok, model = setup
    (tmp_path / "rewriter.py").write_text(REWRITER)
    cfg = AgentEndpointConfig(enabled=True, program=f"{tmp_path / 'rewriter.py'}:play")
    episodes, seen, stats = play(model_dir, tok, cfg, turn_limit=3, n=2)
    assert stats["agent_prefix_breaks"] == 2 * 2
    rollout = Rollout(group_id="g0", actor_id="a", env="guess_number", task_id=3, episodes=episodes)
    assert Guard(group_size=2, max_episode_tokens=512, vocab_size=None).content(rollout) is None
    batch = collate([rollout], 0)
    assert batch.size == 2 * 3  # three segments per episode, one row each
    row = 0
    for ep in episodes:
        assert ep.prefix_breaks == 2 and ep.reward == 0.5 and ep.finish == "turn_limit"
        ids, lps, mask = unpack(ep.token_ids, I32), unpack(ep.logprobs, F32), unpack(ep.loss_mask, U8)
        for k, (s, t) in enumerate(segments(ep)):
            seg = ids[s:t]
            # A segment is one engine call's prompt followed by exactly what it generated.
            first_agent = int(np.flatnonzero(mask[s:t])[0])
            gen = next(
                g for p, g in seen if p == seg[:first_agent].tolist() and g.token_ids == seg[first_agent:].tolist()
            )
            assert np.array_equal(lps[s:t][first_agent:], np.asarray(gen.logprobs, dtype=np.float32))
            assert batch.input_ids[row, : t - s].tolist() == seg.tolist()
            # Each row carries the episode's reward, and is only ever truncated at the last segment.
            assert float(batch.token_rewards[row].sum()) == pytest.approx(0.5)
            assert float(batch.truncated[row]) == float(k == 2)
            ref = learner_logprobs(model, seg, tok)  # the context the model really saw, and only it
            assert np.abs(ref[mask[s:t] == 1] - lps[s:t][mask[s:t] == 1]).max() < 1e-3
            row += 1


FAILING = textwrap.dedent('''
    import time

    def crash(task, client):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "higher"}])
        raise RuntimeError("the agent's own bug")

    def hang(task, client):
        time.sleep(30)

    def greedy(task, client):
        """Ignores max_calls: the call past the turn limit is refused, the episode ends there."""
        while True:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "higher"}])
''')


def test_crashed_hung_and_overlong_agents_cost_one_episode_each(setup, tmp_path: Path) -> None:
    model_dir, tok, _ = setup
    (tmp_path / "failing.py").write_text(FAILING)
    prog = str(tmp_path / "failing.py")
    eps, _, stats = play(model_dir, tok, AgentEndpointConfig(enabled=True, program=f"{prog}:crash"), n=2)
    assert [e.finish for e in eps] == ["env_failure"] * 2 and "the agent's own bug" in eps[0].failure
    assert stats["agent_failures"] == 2
    eps, _, stats = play(model_dir, tok, AgentEndpointConfig(enabled=True, program=f"{prog}:hang", timeout_s=1.0), n=2)
    assert [e.finish for e in eps] == ["env_failure"] * 2 and eps[0].failure.startswith("agent_timeout")
    assert stats["agent_timeouts"] == 2
    eps, _, stats = play(model_dir, tok, AgentEndpointConfig(enabled=True, program=f"{prog}:greedy"), turn_limit=3, n=2)
    assert [(e.finish, e.num_turns, e.reward) for e in eps] == [("turn_limit", 3, 0.0)] * 2
    assert not stats.get("agent_failures")


def test_a_command_agent_with_a_bearer_token(setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir, tok, _ = setup
    monkeypatch.setenv("AGENT_TOKEN", "s3cret")
    cfg = AgentEndpointConfig(enabled=True, command=[sys.executable, EXAMPLE], token_env="AGENT_TOKEN")
    eps, seen, stats = play(model_dir, tok, cfg, n=2, split="test")
    assert all(e.finish in ("done", "turn_limit") for e in eps) and stats["agent_calls"] == len(seen) >= 2
    assert all(e.reward in (0.0, 1.0) and e.success == (e.reward == 1.0) for e in eps)

    async def unauthorized() -> None:
        engine = HfEngine(model_dir, seed=0)
        runner = AgentRunner(cfg, engine, tok)
        await runner.start()
        try:
            good = openai.AsyncOpenAI(base_url=f"{runner.endpoint.url}/v1", api_key="s3cret")
            assert [m.id for m in (await good.models.list()).data] == ["policy"]
            with pytest.raises(openai.AuthenticationError):
                await openai.AsyncOpenAI(base_url=f"{runner.endpoint.url}/v1", api_key="wrong").models.list()
            with pytest.raises(openai.NotFoundError):  # a conversation no ticket opened
                await openai.AsyncOpenAI(
                    base_url=f"{runner.endpoint.url}/c/nokey/v1", api_key="s3cret", max_retries=0
                ).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        finally:
            await runner.close()

    asyncio.run(unauthorized())


def test_config_errors_name_the_key() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="exactly one of program"):
        AgentEndpointConfig(enabled=True)
    with pytest.raises(ValidationError, match="module:function"):
        AgentEndpointConfig(enabled=True, program="no_colon")
    with pytest.raises(ValidationError, match="not loopback: set token_env"):
        AgentEndpointConfig(enabled=True, program="m:f", host="0.0.0.0")
    assert not AgentEndpointConfig().enabled  # off by default


def test_the_guard_refuses_segments_that_do_not_tile_the_episode() -> None:
    from agentgym.protocol import Episode
    from agentgym.protocol.arrays import pack

    def episode(ends: list[int]) -> Rollout:
        ep = Episode(
            token_ids=pack([1, 2, 3, 4], I32),
            logprobs=pack([0, -1, 0, -1], F32),
            loss_mask=pack([0, 1, 0, 1], U8),
            versions=pack([-1, 0, -1, 0], I32),
            turn_ends=pack([2, 4], I32),
            turn_rewards=pack([0, 1], F32),
            reward=1.0,
            success=True,
            finish="done",
            turn_limit=2,
            segment_ends=pack(ends, I32),
            prefix_breaks=1,
        )
        return Rollout(group_id="g", actor_id="a", env="e", task_id=0, episodes=[ep])

    guard = Guard(group_size=1, max_episode_tokens=16, vocab_size=None)
    assert guard.content(episode([2, 4])) is None
    assert collate([episode([2, 4])], 0).input_ids.tolist() == [[1, 2], [3, 4]]
    for bad in ([2, 3], [0, 4], [3, 2, 4]):
        assert guard.content(episode(bad)) == "segment_ends_out_of_order_or_range"


def test_a_streamed_call_routed_by_a_body_field_is_recorded_like_any_other(setup) -> None:
    """``stream=true`` (verifiers' harness programs only stream) and the conversation named by the
    body's ``agentgym_conversation`` (one base URL for every episode): the SDK reassembles the
    completion, and the call is kept as the engine made it."""
    from agentgym.actors.play.agent_endpoint import AgentEndpoint
    from agentgym.actors.play.agent_trace import AgentTrace

    model_dir, tok, _ = setup

    async def go():
        engine = RecordingEngine(model_dir, seed=0)
        await engine.start()
        endpoint = AgentEndpoint(engine, tok)
        await endpoint.start()
        try:
            spec = SamplingSpec(max_tokens=4, temperature=1.0, top_p=1.0, stop_token_ids=(tok.eos_token_id,))
            session = endpoint.open(AgentTrace(tok, 256), spec, turn_limit=2, max_tokens=4)
            client = openai.AsyncOpenAI(base_url=f"{endpoint.url}/v1", api_key="-", max_retries=0)
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "guess a number from 1 to 8"}],
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"agentgym_conversation": session.key},
            )
            chunks = [c async for c in stream]
            return chunks, session, engine.seen
        finally:
            await endpoint.close()
            await engine.close()

    chunks, session, seen = asyncio.run(asyncio.wait_for(go(), 120))
    ((prompt, gen),) = seen
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ids = gen.token_ids[:-1] if gen.finish_reason == "stop" and gen.token_ids[-1] == tok.eos_token_id else gen.token_ids
    assert text == tok.decode(ids) and chunks[-1].usage.completion_tokens == len(gen.token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert session.trace.calls[0].prompt_ids == prompt and session.trace.calls[0].token_ids == gen.token_ids
