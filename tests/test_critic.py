"""Critique in the loop, on real actors' parts: a real guess_number pool (worker subprocesses),
the reference engine on the tiny model, the oracle critic on the env's ``expert_action`` and an
LM critic on the policy's own engine.

The checks are on the ``Episode`` the learner receives: critique messages are masked
non-agent tokens (mask 0, version -1, logprob 0) and are recorded in ``Episode.critiques``; the
learner's recomputation of the agent tokens' logprobs over the token list (critiques in context)
matches the behaviour logprobs, so the revised turns are trained on-policy w.r.t. the context
they were sampled in; evaluation tickets are
played without the critic unless ``at_eval``; the episode log shows critiques as segments.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from agentgym.actors.engines.hf_engine import HfEngine  # noqa: E402
from agentgym.actors.play.critic import LmCritic, OracleCritic, shared_critic  # noqa: E402
from agentgym.actors.play.rollout import play_episode  # noqa: E402
from agentgym.envpool.pool import EnvPool  # noqa: E402
from agentgym.learner.model.logprobs import sequence_logprobs  # noqa: E402
from agentgym.learner.records.episode_log import segments  # noqa: E402
from agentgym.models.tiny import make_default_tiny_model  # noqa: E402
from agentgym.protocol import CriticSpec, Episode, Rollout, RolloutSpec, Ticket, decode, encode  # noqa: E402
from agentgym.protocol.arrays import F32, I32, U8, unpack  # noqa: E402
from agentgym.protocol.vocab import banned_action_ids  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = make_default_tiny_model(tmp_path_factory.mktemp("critic") / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model_dir, tok, model


def play(
    model_dir: Path,
    tok,
    critic_spec: CriticSpec | None,
    n: int,
    turn_limit: int,
    lm: bool = False,
    split: str = "train",
) -> list[Episode]:
    spec = RolloutSpec(
        group_size=n, max_tokens_per_turn=6, max_episode_tokens=1024, temperature=1.0, top_p=1.0, critic=critic_spec
    )

    async def go():
        engine = HfEngine(model_dir, seed=0)
        pool = EnvPool("guess_number", {}, 2)
        await engine.start()
        await pool.start()
        try:
            critic = await shared_critic(critic_spec, engine, tok)
            assert critic_spec is None or isinstance(critic, LmCritic if lm else OracleCritic)
            eps = []
            for task in range(n):  # a few at a time: the tiny model is fast, the machine is small
                ticket = Ticket(
                    group_id=f"g{task}", env="guess_number", task_id=task if split == "train" else 0, split=split
                )
                eps.append(await play_episode(engine, tok, pool, ticket, 0, spec, turn_limit, seed=task, critic=critic))
            return eps
        finally:
            await pool.close()
            await engine.close()

    return asyncio.run(asyncio.wait_for(go(), 120))


def check_masked_and_on_policy(ep: Episode, model, tok) -> int:
    """Critique spans are masked non-agent tokens; agent logprobs match the learner's recomputation."""
    ids, logps = unpack(ep.token_ids, I32), unpack(ep.logprobs, F32)
    mask, vers = unpack(ep.loss_mask, U8), unpack(ep.versions, I32)
    spans = unpack(ep.critiques, I32).reshape(-1, 2)
    for a, b in spans:
        assert 0 <= a < b <= ids.size
        assert not mask[a:b].any() and (vers[a:b] == -1).all() and not logps[a:b].any()
        assert "Critique:" in tok.decode(ids[a:b].tolist())
    with torch.no_grad():
        t = torch.from_numpy(ids.astype(np.int64))[None]
        banned = torch.tensor(banned_action_ids(tok), dtype=torch.long)  # the policy's support (protocol/vocab.py)
        ref = sequence_logprobs(model, t, torch.ones_like(t), banned=banned)[0].numpy()
    assert np.abs(ref[mask == 1] - logps[mask == 1]).max() < 1e-3
    assert np.isfinite(logps).all() and (logps[mask == 1] <= 0).all() and (vers[mask == 0] == -1).all()
    return len(spans)


def test_oracle_every_turn_critiques_are_masked_and_revisions_on_policy_and_help(setup) -> None:
    model_dir, tok, model = setup
    n, limit = 3, 2
    plain = play(model_dir, tok, None, n, limit)
    spec = CriticSpec(kind="oracle", when="every_turn", max_revisions=2)
    guided = play(model_dir, tok, spec, n, limit)
    critiques = sum(check_masked_and_on_policy(ep, model, tok) for ep in guided)
    assert critiques > 0
    assert all(not ep.critiques for ep in plain)
    # Drafts are extra sampled turns with reward 0: turns and rewards stay aligned.
    assert all(ep.num_turns == unpack(ep.turn_rewards, F32).size for ep in guided)
    # Every critique is followed by a revised (sampled) turn.
    assert sum(ep.num_turns for ep in guided) >= critiques
    # The episode log shows the critiques as segments of their own.
    ep = next(e for e in guided if e.critiques)
    segs = segments(ep, lambda ids: tok.decode(ids))
    assert sum(s["role"] == "critique" for s in segs) == len(unpack(ep.critiques, I32)) // 2
    # The critique spans survive the wire.
    r = Rollout(group_id="g", actor_id="a", env="guess_number", task_id=0, episodes=[ep])
    assert decode(encode(r))[0].episodes[0].critiques == ep.critiques


def test_episode_end_retry_and_after_failure_and_eval_without_critic(setup) -> None:
    model_dir, tok, model = setup
    retry = play(model_dir, tok, CriticSpec(kind="oracle", when="episode_end", max_revisions=2), 2, 1)
    for ep in retry:
        k = check_masked_and_on_policy(ep, model, tok)
        assert ep.num_turns == 1 + k  # one turn per attempt; a critique opens each retry
        assert ep.success or k == 2
    assert any(ep.critiques for ep in retry)
    after = play(model_dir, tok, CriticSpec(kind="oracle", when="after_failure"), 1, 2)
    assert sum(check_masked_and_on_policy(ep, model, tok) for ep in after) > 0
    # Evaluation tickets: no critic unless at_eval.
    evals = play(model_dir, tok, CriticSpec(kind="oracle", when="every_turn"), 1, 1, split="test")
    assert not evals[0].critiques
    evals = play(model_dir, tok, CriticSpec(kind="oracle", when="every_turn", at_eval=True), 1, 1, split="test")
    assert evals[0].critiques


def test_lm_critic_on_the_policy_engine_speaks_and_stays_masked(setup) -> None:
    model_dir, tok, model = setup
    spec = CriticSpec(kind="lm", engine="policy", when="after_failure", max_tokens=8)
    eps = play(model_dir, tok, spec, 1, 2, lm=True)
    assert sum(check_masked_and_on_policy(ep, model, tok) for ep in eps) > 0


def test_lm_critic_on_its_own_engine_speaks_and_stays_masked(setup) -> None:
    # A second model (here another copy of the tiny one) in its own hf engine beside the policy's.
    model_dir, tok, model = setup
    spec = CriticSpec(kind="lm", engine="hf", model=str(model_dir), when="after_failure", max_tokens=8)
    eps = play(model_dir, tok, spec, 1, 2, lm=True)
    assert sum(check_masked_and_on_policy(ep, model, tok) for ep in eps) > 0


def test_lm_critic_with_a_missing_model_dir_says_so(setup, tmp_path: Path) -> None:
    spec = CriticSpec(kind="lm", engine="hf", model=str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="critic.model"):
        asyncio.run(shared_critic(spec, type("NoEngine", (), {})(), None))


def test_train_with_the_oracle_critic_end_to_end(tmp_path: Path, setup) -> None:
    """``agentgym train``: a learner and one actor (hf engine) over ZeroMQ, the oracle critic
    speaking every turn; the learner trains on the critiqued groups (its validation accepts them)
    and the episode log shows the critiques."""
    import json
    import os
    import subprocess
    import sys

    from agentgym.host.netutil import free_port_pair

    model_dir = setup[0]
    run_dir, steps = tmp_path / "run", 3
    args = [
        "train",
        "--config",
        str(Path(__file__).resolve().parents[1] / "configs" / "quickstart.toml"),
        "--run-dir",
        str(run_dir),
        "--actors",
        "1",
        "--max-steps",
        str(steps),
        "-o",
        f'learner.bind="tcp://127.0.0.1:{free_port_pair()}"',
        "-o",
        f'model.path="{model_dir}"',
        "-o",
        "model.create_tiny=false",
        "-o",
        'actor.engine="hf"',
        "-o",
        "rollout.group_size=2",
        "-o",
        "learner.batch_groups=2",
        "-o",
        "eval.at_start=false",
        "-o",
        "eval.at_end=false",
        "-o",
        "eval.every=0",
        "-o",
        "critic.enabled=true",
        "-o",
        'critic.kind="oracle"',
        "-o",
        'critic.when="every_turn"',
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", *args],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    logged = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    critiqued = [e for e in logged if e["critiques"]]
    assert critiqued, "no logged episode had a critique"
    assert all(any(s["role"] == "critique" and "Critique:" in s["text"] for s in e["segments"]) for e in critiqued)
    from agentgym.observe.viewer import build_page, run_data

    shown = run_data(run_dir)["episodes"]
    assert any(e["critiques"] and any(s["role"] == "critique" for s in e["segments"]) for e in shown)
    assert "Critique:" in build_page(run_dir)


def test_critic_config_travels_in_the_rollout_spec_and_typos_are_named() -> None:
    from agentgym.config import ConfigError, load_config
    from agentgym.learner.control.actor_control import rollout_spec

    assert rollout_spec(load_config(None)).critic is None  # off by default
    cfg = load_config(None, ["critic.enabled=true", 'critic.when="episode_end"', "critic.max_revisions=3"])
    spec = rollout_spec(cfg)
    assert spec.critic == CriticSpec(kind="oracle", when="episode_end", max_revisions=3)
    assert decode(encode(welcome_with(spec)))[0].rollout.critic == spec.critic
    with pytest.raises(ConfigError, match="critic"):
        load_config(None, ['critic.when="sometimes"'])
    with pytest.raises(ConfigError, match="critic"):
        load_config(None, ["critic.max_revision=2"])


def welcome_with(spec: RolloutSpec):
    from agentgym.protocol import Welcome

    return Welcome(
        run_id="r",
        actor_index=0,
        weights_port=1,
        model_path="m",
        model_fingerprint="f",
        mode="async",
        heartbeat_interval_s=1.0,
        actor_timeout_s=1.0,
        rollout=spec,
    )
