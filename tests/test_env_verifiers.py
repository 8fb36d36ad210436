"""The verifiers env adapter against the real package (pip ``verifiers`` 0.4.0, ``verifiers.v1``).

Real pieces: verifiers' env, taskset loader, interception server, its ``null`` chat harness run as a
program by its subprocess runtime (with uv, as verifiers runs it), its ``@vf.reward`` scoring; the
actor's agent endpoint and runner; the reference engine (``hf``) on the tiny model, started once.
Checks: the tokens of a verifiers episode are bitwise the engine's, the rubric's reward is the
episode's, and bad options fail at start-up in one line naming what was wrong.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import numpy as np
import pytest

# No skip where verifiers is missing: scripts/install.sh installs it, and CI must not pass without it.
import verifiers.v1  # noqa: F401
from engine_fixtures import RecordingEngine

from agentgym.actors.play.agent_runner import AgentRunner
from agentgym.cli.args import preflight
from agentgym.config import load_config
from agentgym.config.actor import AgentEndpointConfig
from agentgym.envpool.envs.verifiers_env import PROGRAM
from agentgym.envpool.registry import EnvOptionsError, check_env, known_envs, resolve_env
from agentgym.models.tiny import make_default_tiny_model
from agentgym.protocol import RolloutSpec, Ticket
from agentgym.protocol.arrays import F32, I32, U8, unpack

REPO = Path(__file__).resolve().parents[1]

# A taskset whose rubric pays len(reply) + 1: never 0, and a function of the exact reply text.
LENGTH = textwrap.dedent("""
    import verifiers.v1 as vf

    __all__ = ["LengthTaskset"]

    class LengthTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
        @vf.reward
        async def length(self, task: vf.TaskData, trace: vf.Trace) -> float:
            return float(len(trace.last_reply or "") + 1)

    class LengthTaskset(vf.Taskset[LengthTask, vf.TasksetConfig]):
        def load(self):
            for n in range(1, 9):
                yield LengthTask(vf.TaskData(prompt=f"say {n}"), self.config.task)
""")
# A taskset whose rubric raises: the env failing mid-episode, after the model's call.
RAISING = textwrap.dedent("""
    import verifiers.v1 as vf

    __all__ = ["RaisingTaskset"]

    class RaisingTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
        @vf.reward
        async def judged(self, task: vf.TaskData, trace: vf.Trace) -> float:
            raise KeyError("the judge's answer key has no 'say 1'")

    class RaisingTaskset(vf.Taskset[RaisingTask, vf.TasksetConfig]):
        def load(self):
            for n in range(1, 5):
                yield RaisingTask(vf.TaskData(prompt=f"say {n}"), self.config.task)
""")
BROKEN = textwrap.dedent("""
    import verifiers.v1 as vf

    __all__ = ["BrokenTaskset"]

    class BrokenTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
        def load(self):
            raise FileNotFoundError("data/rows.jsonl is missing")
""")


@pytest.fixture(scope="module")
def tasksets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tasksets")
    (d / "vf_length_taskset.py").write_text(LENGTH)
    (d / "vf_broken_taskset.py").write_text(BROKEN)
    (d / "vf_raising_taskset.py").write_text(RAISING)
    return d


def test_verifiers_episodes_are_the_engines_tokens_and_carry_the_rubrics_reward(
    tmp_path_factory, tasksets: Path
) -> None:
    from transformers import AutoTokenizer

    model_dir = make_default_tiny_model(tmp_path_factory.mktemp("vf") / "tiny", seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    say = {"taskset.id": "verifiers_say", "taskset.size": 16, "python_path": [str(REPO / "examples")]}
    length = {"taskset.id": "vf_length_taskset", "python_path": [str(tasksets)], "test_fraction": 0.25}
    spec = RolloutSpec(
        group_size=2,
        max_tokens_per_turn=3,
        max_episode_tokens=256,
        temperature=1.0,
        top_p=1.0,
        env_kwargs={"verifiers": length},
    )

    async def go():
        engine = RecordingEngine(model_dir, seed=0)
        await engine.start()
        stats: dict[str, int] = {}
        runner = AgentRunner(AgentEndpointConfig(enabled=True, program=PROGRAM), engine, tok, stats)
        await runner.start()
        try:
            train = Ticket(group_id="g0", env="verifiers", task_id=5, split="train")
            test = Ticket(group_id="g1", env="verifiers", task_id=1, split="test")
            eps = await asyncio.gather(*(runner.play(t, i, spec, 2) for t in (train, test) for i in range(2)))
            say_spec = RolloutSpec(
                group_size=1,
                max_tokens_per_turn=3,
                max_episode_tokens=256,
                temperature=1.0,
                top_p=1.0,
                env_kwargs={"verifiers": say},
            )
            # A turn limit of one call: the harness ends the episode itself, whatever the reward.
            said = await runner.play(Ticket(group_id="g2", env="verifiers", task_id=0, split="train"), 0, say_spec, 1)
            seen = list(engine.seen)
            raising = {"taskset.id": "vf_raising_taskset", "python_path": [str(tasksets)], "test_fraction": 0.25}
            failed = await runner.play(
                Ticket(group_id="g3", env="verifiers", task_id=0, split="train"),
                0,
                msgspec.structs.replace(say_spec, env_kwargs={"verifiers": raising}),
                1,
            )
            return eps, said, failed, seen, stats
        finally:
            await runner.close()
            await engine.close()

    episodes, said, failed, seen, stats = asyncio.run(asyncio.wait_for(go(), 240))
    assert stats["agent_episodes"] == 6 and stats["agent_failures"] == 1 and stats["agent_prefix_breaks"] == 0
    for ep in episodes:
        assert ep.finish == "done" and ep.num_turns == 1 and ep.prefix_breaks == 0, ep.failure
        ids, lps, mask = unpack(ep.token_ids, I32), unpack(ep.logprobs, F32), unpack(ep.loss_mask, U8)
        # The one call: the engine was given exactly the prompt tokens and generated exactly the
        # tokens trained, with these logprobs (bitwise).
        n = int(mask.sum())
        gen = next(
            g for p, g in seen if p == ids[: len(ids) - n].tolist() and g.token_ids == ids[len(ids) - n :].tolist()
        )
        assert (mask[len(ids) - n :] == 1).all() and not mask[: len(ids) - n].any()
        assert np.array_equal(lps[len(ids) - n :], np.asarray(gen.logprobs, dtype=np.float32))
        # The rubric's reward, computed by verifiers on the reply the endpoint returned.
        reply = tok.decode([t for t in gen.token_ids if t != tok.eos_token_id])
        assert ep.reward == float(len(reply.strip()) + 1) and ep.success  # last_reply is stripped
    # Train and test tickets play the taskset's own disjoint splits (every 4th task is test):
    # train id 5 is train[5 % 6], task 6 ("say 7"); test index 1 is task 7 ("say 8").
    prompts = {tok.decode(p) for p, _ in seen}
    assert {p.split("user")[1].split("<")[0].strip() for p in prompts} == {"say 7", "say 8", "say 1"}, prompts
    # The example taskset: its rubric pays 1 only for the number asked (the reply is the last call's).
    reply = tok.decode([t for t in seen[-1][1].token_ids if t != tok.eos_token_id])
    expected = 1.0 if (m := re.search(r"\d+", reply.strip())) and int(m.group()) == 1 else 0.0
    assert (said.finish, said.reward, said.failure) == ("done", expected, "")
    # An env that raises mid-episode (its rubric, after the model's call): that episode is an env
    # failure, trained on by no one, its error one line naming what raised; the others played on.
    assert (failed.finish, failed.reward, failed.success) == ("env_failure", 0.0, False)
    assert failed.failure.startswith("agent_error: RuntimeError: verifiers episode failed: ")
    assert "the judge's answer key has no 'say 1'" in failed.failure and "\n" not in failed.failure


def test_the_adapter_is_registered_and_lists_its_needs() -> None:
    assert "verifiers" in known_envs() and resolve_env("verifiers").name == "verifiers"
    proc = subprocess.run(
        [sys.executable, "-m", "agentgym.cli.main", "envs"], capture_output=True, text=True, timeout=60
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("verifiers"))
    assert "[verifiers]" in line and "agent endpoint" in line


@pytest.mark.parametrize(
    "options, match",
    [
        (
            {"taskset.id": "textarenaa"},
            r"unknown taskset 'textarenaa' \(did you mean textarena\?\): no module 'textarenaa' on the import path "
            r".*verifiers' \d+ built-in tasksets: .*openenv, textarena",
        ),
        (
            {"taskset.id": "vf_broken_taskset"},
            r"cannot load taskset 'vf_broken_taskset': FileNotFoundError: data/rows.jsonl is missing",
        ),
        ({"taskset.size": 3}, r"set \"taskset.id\""),
        ({"taskset.id": "verifiers_say", "size": 3}, r"unknown option\(s\) \['size'\]"),
        ({"taskset.id": "verifiers_say", "taskset.size": 1}, r"has 1 task\(s\): too few for a train and a test split"),
    ],
)
def test_bad_options_fail_in_one_line_naming_what_was_wrong(tasksets: Path, options: dict, match: str) -> None:
    paths = [str(tasksets), str(REPO / "examples")]
    with pytest.raises(EnvOptionsError, match=r"^env\.kwargs: env verifiers: .*" + match) as err:
        check_env("verifiers", {**options, "python_path": paths})
    assert "\n" not in str(err.value)


def test_start_up_stops_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``agentgym train``'s preflight: an unknown taskset, and a run that forgot the endpoint."""
    base = [
        "model.path='models/tiny'",
        "model.create_tiny=true",
        "env.name='verifiers'",
        "actor.agent_endpoint.enabled=true",
        f"actor.agent_endpoint.program='{PROGRAM}'",
    ]
    cfg = load_config(None, [*base, "env.kwargs={'taskset.id'='no_such_taskset'}"])
    with pytest.raises(SystemExit):
        preflight(cfg, env_options=True)
    err = capsys.readouterr().err
    assert (
        err.startswith("error: env.kwargs: env verifiers: unknown taskset 'no_such_taskset'") and err.count("\n") == 1
    )
    path = str(REPO / "examples")
    cfg = load_config(None, [*base[:3], f"env.kwargs={{'taskset.id'='verifiers_say', python_path=['{path}']}}"])
    with pytest.raises(SystemExit):
        preflight(cfg, env_options=True)
    err = capsys.readouterr().err
    assert "set actor.agent_endpoint.enabled = true and program" in err and err.count("\n") == 1


def test_without_the_package_the_error_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['verifiers'] = None\n"  # how Python itself marks a module absent
        "from agentgym.envpool.registry import check_env\n"
        "try:\n    check_env('verifiers', {'taskset.id': 'verifiers_say'})\nexcept ValueError as e:\n    print(e)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "env verifiers needs the verifiers package" in proc.stdout and "pip install -e '.[verifiers]'" in proc.stdout
