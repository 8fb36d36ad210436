"""Learner ranks started the torchrun way (RANK/WORLD_SIZE in the environment, a configured
rendezvous address), as on several hosts: rank 0 is this process's Trainer, rank 1 a separate
``agentgym-learner`` process that becomes a worker; together they take the same optimizer steps
as one rank (as tests/test_learner_dp.py checks for locally spawned ranks). The policy trains
LoRA adapters (learner.lora), so the same run checks that adapters, their gradients and the
adapter-less KL reference work across ranks; full weights cross ranks by the same code, which
tests/test_learner_dp.py covers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from learner_fixtures import bandit_rollouts, make_cfg
from netns import Cluster, netns_unavailable

from agentgym.config import to_toml
from agentgym.learner.model.lora import adapter_state
from agentgym.learner.training.distributed import free_port, launch_env, rendezvous
from agentgym.learner.training.trainer import Trainer
from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model

COMMON = (
    "learner.algorithm=ppo",
    "learner.minibatches=2",
    "learner.micro_batch_tokens=16",
    "learner.kl_coef=0.05",
    "learner.entropy_coef=0.01",
    "learner.lr=3e-3",
    "learner.dist_timeout_s=120",
    "learner.lora.rank=4",
)
METRICS = (
    "loss",
    "pg_loss",
    "value_loss",
    "kl_ref",
    "entropy",
    "grad_norm",
    "clip_frac",
    "approx_kl",
    "is_weight_mean",
)
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
HERE = Path(__file__).resolve().parent
NO_NETNS = netns_unavailable()


def _steps(tr: Trainer, n: int) -> list[dict[str, float]]:
    return [tr.train_step(bandit_rollouts(version=tr.version, group_size=3)) for _ in range(n)]


def test_two_ranks_started_the_torchrun_way_train_like_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    model_dir = make_tiny_model(tmp_path / "m", corpus=FALLBACK_CORPUS, seed=0)
    one = Trainer.load(make_cfg(model_dir, *COMMON))
    assert one.dp.world == 1
    m_one = _steps(one, 2)

    # The rendezvous is rank 0's address from the config, the same file every rank reads.
    cfg = make_cfg(model_dir, *COMMON, f'learner.dist_init_addr="tcp://127.0.0.1:{free_port()}"')
    (tmp_path / "config.toml").write_text(to_toml(cfg))
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "PYTHONUNBUFFERED": "1"}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgym.learner.main",
            "--config",
            str(tmp_path / "config.toml"),
            "--run-dir",
            str(tmp_path / "rank1"),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
        two = Trainer.load(cfg)
        try:
            assert dist.get_backend() == "gloo" and dist.get_world_size() == 2 and not two.dp.procs
            m_two = _steps(two, 2)
            assert two.rank_divergence() == 0.0  # rank 1 holds exactly rank 0's weights
        finally:
            two.close()
        out, _ = worker.communicate(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, out[-3000:]
    assert not dist.is_initialized()
    log = (tmp_path / "rank1" / "logs" / "learner-rank1.jsonl").read_text()
    assert '"dp_worker_stopped"' in log and '"learner_listening"' not in log  # a worker, not a second learner

    for a, b in zip(m_one, m_two, strict=True):
        assert (a["trained_tokens"], a["optimizer_steps"]) == (b["trained_tokens"], b["optimizer_steps"]) == (6.0, 2.0)
        for k in METRICS:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    for (k, p), q in zip(one.model.state_dict().items(), two.model.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=k)
    assert one.value_head is not None and two.value_head is not None
    torch.testing.assert_close(one.value_head.linear.weight, two.value_head.linear.weight, rtol=1e-4, atol=1e-5)
    moved = [k for k, v in adapter_state(two.model).items() if ".lora_B." in k and v.abs().max() > 0]
    assert moved  # the adapters trained (B starts at zero)


def test_launch_environment_is_checked(tmp_path: Path) -> None:
    assert launch_env({}) is None
    le = launch_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert le is not None and (le.rank, le.world, le.local_rank) == (3, 4, 1)
    with pytest.raises(ValueError, match="RANK < WORLD_SIZE"):
        launch_env({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="must be integers"):
        launch_env({"RANK": "one", "WORLD_SIZE": "2"})
    cfg = make_cfg(tmp_path)
    assert rendezvous(cfg, {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}) == "env://"
    with pytest.raises(ValueError, match="MASTER_PORT is not"):
        rendezvous(cfg, {"MASTER_ADDR": "10.0.0.1"})
    assert rendezvous(make_cfg(tmp_path, 'learner.dist_init_addr="tcp://10.0.0.1:29500"'), {}) == "tcp://10.0.0.1:29500"
    with pytest.raises(ValueError, match="dist_init_addr must be tcp://HOST:PORT"):
        make_cfg(tmp_path, 'learner.dist_init_addr="10.0.0.1"')


RANK0 = """
import json, sys
sys.path.insert(0, sys.argv[3])
from learner_fixtures import make_cfg, bandit_rollouts
from agentgym.config import load_config
from agentgym.learner.training.trainer import Trainer
from safetensors.torch import save_file
tr = Trainer.load(load_config(sys.argv[1], []))
ms = [tr.train_step(bandit_rollouts(version=tr.version, group_size=3)) for _ in range(2)]
assert tr.rank_divergence() == 0.0, "rank 1 does not hold rank 0's weights"
save_file({k: v.contiguous() for k, v in tr.model.state_dict().items()}, sys.argv[2] + ".safetensors")
json.dump({"metrics": ms, "world": tr.dp.world}, open(sys.argv[2] + ".json", "w"))
tr.close()
"""


@pytest.mark.skipif(NO_NETNS is not None, reason=f"no network namespaces: {NO_NETNS}")
@pytest.mark.timeout(600)
def test_two_ranks_on_two_hosts_train_like_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 and rank 1 in two network namespaces (their own addresses, no loopback between
    them), started the torchrun way with the rendezvous on rank 0's host: the same steps as one
    rank in this process."""
    from safetensors.torch import load_file

    for k in TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    model_dir = make_tiny_model(tmp_path / "m", corpus=FALLBACK_CORPUS, seed=0)
    one = Trainer.load(make_cfg(model_dir, *COMMON))
    m_one = _steps(one, 2)

    with Cluster(["r0", "r1"]) as net:
        cfg = make_cfg(model_dir, *COMMON, f'learner.dist_init_addr="tcp://{net.addr("r0")}:29511"')
        (tmp_path / "config.toml").write_text(to_toml(cfg))
        base = {**os.environ, "WORLD_SIZE": "2", "LOCAL_RANK": "0", "PYTHONUNBUFFERED": "1"}
        out = tmp_path / "rank0"
        r0 = net.spawn(
            "r0",
            [sys.executable, "-c", RANK0, str(tmp_path / "config.toml"), str(out), str(HERE)],
            tmp_path,
            tmp_path / "r0.log",
            {**base, "RANK": "0"},
        )
        r1 = net.spawn(
            "r1",
            [
                sys.executable,
                "-m",
                "agentgym.learner.main",
                "--config",
                str(tmp_path / "config.toml"),
                "--run-dir",
                str(tmp_path / "rank1"),
            ],
            tmp_path,
            tmp_path / "r1.log",
            {**base, "RANK": "1"},
        )
        for p, name in ((r0, "r0"), (r1, "r1")):
            try:
                p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                pytest.fail(f"rank {name} did not finish:\n{(tmp_path / f'{name}.log').read_text()[-3000:]}")
            assert p.returncode == 0, (tmp_path / f"{name}.log").read_text()[-3000:]

    res = json.loads((tmp_path / "rank0.json").read_text())
    assert res["world"] == 2
    log = (tmp_path / "rank1" / "logs" / "learner-rank1.jsonl").read_text()
    assert '"dp_worker_stopped"' in log and '"learner_listening"' not in log
    for a, b in zip(m_one, res["metrics"], strict=True):
        assert (a["trained_tokens"], a["optimizer_steps"]) == (b["trained_tokens"], b["optimizer_steps"]) == (6.0, 2.0)
        for k in METRICS:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    two = load_file(str(tmp_path / "rank0.safetensors"))
    for k, p in one.model.state_dict().items():
        torch.testing.assert_close(p, two[k], rtol=1e-4, atol=1e-5, msg=k)
