"""Episodes/s through the agent endpoint against the native env path, on the same task and engine.

    python bench/agent_endpoint_bench.py [--engine hf|sim] [--groups 4] [--group-size 8] [--rounds 3]

Both paths play guess_number (1 to 8, 6 turns, the tiny model, one token per turn as the
quickstart) with one shared engine, ``--groups`` tickets of ``--group-size`` episodes at once,
round after round:
- native: ``play_episode`` (actors/play/rollout.py) with an env pool of worker subprocesses;
- endpoint: ``AgentRunner`` (actors/play/agent_runner.py) running examples/guess_number_agent.py, an
  ``openai.OpenAI`` loop in a thread per episode, over HTTP on loopback.
The rounds alternate (native, endpoint, native, ...) so drift in the machine's load hits both.
Printed: episodes/s of each path, their ratio (endpoint / native), calls per episode and the
example's prefix-break rate (breaks per call after an episode's first).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


async def main(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from agentgym.actors.play.agent_runner import AgentRunner
    from agentgym.actors.play.rollout import play_episode
    from agentgym.config.actor import AgentEndpointConfig
    from agentgym.envpool.pool import EnvPool
    from agentgym.models.tiny import make_default_tiny_model
    from agentgym.protocol import RolloutSpec, Ticket

    model_dir = make_default_tiny_model(Path(tempfile.mkdtemp()) / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    if args.engine == "hf":
        from agentgym.actors.engines.hf_engine import HfEngine

        engine = HfEngine(model_dir, seed=0)
    else:
        from agentgym.actors.engines.sim_engine import SimEngine

        engine = SimEngine(vocab_size=len(tok), tokens_per_s=200, latency_s=0.02, seed=0)
    spec = RolloutSpec(
        group_size=args.group_size,
        max_tokens_per_turn=1,
        max_episode_tokens=256,
        temperature=1.0,
        top_p=1.0,
        env_kwargs={"guess_number": {"low": 1, "high": 8}},
    )
    stats: dict[str, int] = {}
    runner = AgentRunner(
        AgentEndpointConfig(
            enabled=True,
            program=f"{REPO / 'examples' / 'guess_number_agent.py'}:play",
            max_agents=args.groups * args.group_size,
        ),
        engine,
        tok,
        stats,
    )
    pool = EnvPool("guess_number", {"low": 1, "high": 8}, args.groups * args.group_size)
    await engine.start()
    await runner.start()
    await pool.start()
    task = 0

    async def round_(kind: str) -> float:
        nonlocal task
        tickets = [
            Ticket(group_id=f"{kind}{task + g}", env="guess_number", task_id=task + g) for g in range(args.groups)
        ]
        task += args.groups
        t0 = time.perf_counter()
        eps = await asyncio.gather(
            *(
                runner.play(t, i, spec, args.turns)
                if kind == "endpoint"
                else play_episode(engine, tok, pool, t, i, spec, args.turns)
                for t in tickets
                for i in range(spec.group_size)
            )
        )
        dt = time.perf_counter() - t0
        assert all(e.finish != "env_failure" for e in eps), [e.failure for e in eps if e.failure][:2]
        return len(eps) / dt

    try:
        await round_("native")  # warm-up: workers, threads, first HTTP connections
        await round_("endpoint")
        stats.clear()
        rates: dict[str, list[float]] = {"native": [], "endpoint": []}
        for _ in range(args.rounds):
            for kind in ("native", "endpoint"):
                rates[kind].append(await round_(kind))
    finally:
        await pool.close()
        await runner.close()
        await engine.close()
    nat, end = statistics.median(rates["native"]), statistics.median(rates["endpoint"])
    calls, eps_n = stats["agent_calls"], stats["agent_episodes"]
    print(f"engine={args.engine} groups={args.groups} group_size={args.group_size} rounds={args.rounds}")
    print(f"native    episodes/s  median {nat:7.1f}  rounds {[round(x, 1) for x in rates['native']]}")
    print(f"endpoint  episodes/s  median {end:7.1f}  rounds {[round(x, 1) for x in rates['endpoint']]}")
    print(f"ratio endpoint/native {end / nat:.2f}")
    print(
        f"calls/episode {calls / eps_n:.2f}  prefix breaks {stats.get('agent_prefix_breaks', 0)} "
        f"of {calls - eps_n} calls after the first (rate {stats.get('agent_prefix_breaks', 0) / max(1, calls - eps_n):.3f})"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["hf", "sim"], default="hf")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(ap.parse_args()))
