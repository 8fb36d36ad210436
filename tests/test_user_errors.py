"""A user's mistakes, run as the user runs them: each command is a real process, and each must
end with one line on stderr naming the key or flag and what is expected, a nonzero exit code and
no traceback, before any engine, model or socket starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = str(REPO / "configs" / "quickstart.toml")

# (what the user typed after `python -m`, words the one line must hold)
MISTAKES: list[tuple[list[str], list[str]]] = [
    # addresses: a bare HOST:PORT would reach zmq and fail there with "Invalid argument"
    (["agentgym.actors.main", "--learner", "127.0.0.1:5555"], ["actor.learner", "tcp://HOST:PORT"]),
    (["agentgym.actors.main", "--learner", "tcp://127.0.0.1"], ["actor.learner", "tcp://HOST:PORT"]),
    (["agentgym.actors.main", "--weights-relay", "127.0.0.1:5560"], ["actor.weights_relay", "tcp://HOST:PORT"]),
    (["agentgym.learner.main", "--bind", "127.0.0.1:5555"], ["learner.bind", "tcp://HOST:PORT"]),
    (["agentgym.learner.main", "--bind", "tcp://127.0.0.1:0"], ["learner.bind", "fixed port"]),
    (["agentgym.cluster.relay", "--upstream", "foo"], ["--upstream", "tcp://HOST:PORT"]),
    (["agentgym.cluster.relay", "--upstream", "tcp://127.0.0.1:5556", "--bind", "5560"], ["--bind", "tcp://HOST:PORT"]),
    # env names: refused at learner start, before the learner listens or an actor starts an engine
    (["agentgym.learner.main", "-o", 'env.name="nosuchenv"'], ["env.name", "nosuchenv", "guess_number"]),
    (["agentgym.cli", "train", "--config", QUICKSTART, "-o", 'env.name="nosuchenv"'], ["env.name", "nosuchenv"]),
    (
        ["agentgym.learner.main", "-o", 'env.mix=[{name = "guess_number"}, {name = "mazes"}]'],
        ["env.mix[1].name", "mazes"],
    ),
    (["agentgym.cli", "eval", "--model", "models/none", "--env", "nosuchenv"], ["--env", "nosuchenv"]),
    # models: a local HF directory or a hub id in the local cache; otherwise how to download it
    (
        ["agentgym.learner.main", "--model", "Qwen/No-Such-Model-0.5B"],
        ["--model", "hf download Qwen/No-Such-Model-0.5B"],
    ),
    (["agentgym.learner.main", "-o", 'model.path="/nonexistent/model"'], ["model.path", "/nonexistent/model"]),
    (
        [
            "agentgym.cli",
            "train",
            "--config",
            QUICKSTART,
            "-o",
            "model.create_tiny=false",
            "-o",
            'model.path="acme/tiny"',
        ],
        ["model.path", "hf download acme/tiny"],
    ),
    (["agentgym.actors.main", "--model", "acme/tiny"], ["--model", "hf download acme/tiny"]),
    (["agentgym.cli", "eval", "--model", "Qwen/No-Such-Model-0.5B", "--engine", "hf"], ["--model", "hf download"]),
    (["agentgym.cli", "eval", "--model", "."], ["--model", "config.json"]),
    # metric sinks whose library is missing (wandb hidden below by a package that fails to import)
    (["agentgym.learner.main", "-o", 'metrics.sinks=["jsonl", "wandb"]'], ["metrics.sinks", "agentgym[wandb]"]),
    (["agentgym.learner.main", "-o", 'metrics.sinks=["tensorbord"]'], ["metrics.sinks"]),
    (
        ["agentgym.cli", "train", "--config", QUICKSTART, "-o", 'metrics.sinks=["wandb"]'],
        ["metrics.sinks", "agentgym[wandb]"],
    ),
    # config files and overrides
    (["agentgym.cli", "train", "--config", "nosuch.toml"], ["nosuch.toml", "does not exist"]),
    (["agentgym.cli", "config", "-o", "learner.lr"], ["learner.lr", "KEY=VALUE"]),
    (["agentgym.cli", "config", "-o", "learner.batch_grups=4"], ["learner.batch_grups", "unknown key"]),
    (["agentgym.cli", "config", "-o", "run.max_steps=-1"], ["run.max_steps", "greater than or equal to 0"]),
    (["agentgym.cli", "config", "-o", 'actor.engine="remote"'], ["actor.remote.url"]),
    (["agentgym.cli", "config", "-o", "metrics.wandb.mode=sometimes"], ["metrics.wandb.mode", "offline"]),
    (["agentgym.learner.main", "--resume", "nosuchrun"], ["nosuchrun", "does not exist"]),
    (["agentgym.cli", "train", "--resume", "--run-dir", "nosuchrun"], ["nosuchrun", "does not exist"]),
    (["agentgym.cli", "config", "--config", str(REPO / "README.md")], ["README.md", "not valid TOML"]),
    # key files
    (
        ["agentgym.actors.main", "--secret-key", "nokey", "--learner-key", "nokey", "--connect-timeout", "1"],
        ["key file nokey does not exist", "agentgym keys"],
    ),
    (
        ["agentgym.learner.main", "--secret-key", "nokey", "-o", "model.create_tiny=true"],
        ["learner.secret_key", "learner.authorized_keys"],
    ),
    # the learner takes a model; the demo's is made by the launcher (agentgym train), not by it
    (
        ["agentgym.learner.main", "-o", "model.create_tiny=true", "-o", 'model.path="models/not-made"'],
        ["model.path", "models/not-made", "agentgym train"],
    ),
    # command flags
    (["agentgym.cli", "eval", "--model", "models/none", "-k", "0"], ["-k", ">= 1"]),
    (["agentgym.cli", "view", "nosuchrun"], ["nosuchrun"]),
]


def _run(args: list[str], cwd: Path, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    hide = cwd / "hide"  # a `wandb` that fails to import, as when it is not installed
    (hide / "wandb").mkdir(parents=True, exist_ok=True)
    (hide / "wandb" / "__init__.py").write_text("raise ImportError(\"No module named 'wandb'\")\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(hide), os.environ.get("PYTHONPATH")])),
        "HF_HUB_CACHE": str(cwd / "hub"),
        "HF_HUB_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout, **kw
    )


@pytest.mark.parametrize(("args", "words"), MISTAKES, ids=[" ".join(a[1:])[:60] for a, _ in MISTAKES])
def test_a_mistake_is_one_line_and_a_nonzero_exit(args: list[str], words: list[str], tmp_path: Path) -> None:
    proc = _run(args, tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode != 0, f"exit 0 for {args}: {proc.stdout[-500:]}"
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, f"{len(err.splitlines())} lines on stderr:\n{err}"
    for w in words:
        assert w in err, f"{w!r} not in: {err}"
    # nothing started: at most the JSON log of a process that set up its logging (no metrics,
    # checkpoints, resolved config or actor record)
    started = [p for p in tmp_path.glob("runs/**/*") if p.is_file() and p.parent.name != "logs"]
    assert not started, started


def test_a_closed_pipe_ends_output_quietly(tmp_path: Path) -> None:
    """`agentgym config --explain | head -1`: the reader leaves after one line."""
    import fcntl

    # A pipe of one page (Linux's F_SETPIPE_SZ): the ~30 KB of output cannot all be written
    # before the reader leaves, whatever the timing, so the writer really meets a closed pipe.
    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentgym.cli", "config", "--explain"], cwd=tmp_path, stdout=w, stderr=subprocess.PIPE
    )
    os.close(w)
    reader = os.fdopen(r, "rb")
    assert proc.stderr is not None
    first = reader.readline()
    reader.close()  # what `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) != 0 and first.strip()
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_hub_id_in_the_local_cache_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule for every command: a hub id whose snapshot is in HF_HUB_CACHE resolves to it
    (no network); here the learner then stops on the next mistake, the unknown env."""
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("0123abc")
    import huggingface_hub.constants

    from agentgym.config.model_path import find_model

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert find_model("acme/tiny", "model.path") == snap
    proc = _run(["agentgym.cli", "config", "-o", 'model.path="acme/tiny"'], tmp_path)
    assert proc.returncode == 0, proc.stderr  # the config itself is fine with a hub id
    proc = _run(
        ["agentgym.actors.main", "--model", "acme/tiny", "--learner", "tcp://127.0.0.1:1", "--connect-timeout", "0.5"],
        tmp_path,
    )
    assert "hf download" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_config_with_several_mistakes_is_one_line_naming_each(tmp_path: Path) -> None:
    """`agentgym train --config bad.toml` with three mistakes: one line that counts them and names
    each key (with the known key a typo is closest to), before anything starts."""
    (tmp_path / "bad.toml").write_text("[learner]\nlrr = 1e-3\nbatch_groups = 0\n[rollout]\ntempreature = 0.5\n")
    proc = _run(["agentgym.cli", "train", "--config", "bad.toml"], tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode != 0 and "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert "invalid config (bad.toml): 3 problems: " in err, err
    for words in (
        "learner.lrr: unknown key (did you mean lr?)",
        "learner.batch_groups: ",
        "rollout.tempreature: unknown key (did you mean temperature?)",
    ):
        assert words in err, f"{words!r} not in: {err}"
    assert not [p for p in tmp_path.glob("runs/**/*") if p.is_file() and p.parent.name != "logs"]
