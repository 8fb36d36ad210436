"""Weight sync against learner steps at real model shapes, side by side in one run.

    python bench/real_scale.py --out /tmp/real_scale            # all shapes
    python bench/real_scale.py --shapes tiny,qwen2.5-0.5b --train-steps 3 --engine vllm

For each shape (``agentgym make-model``: tiny, Qwen2.5-0.5B, Qwen2.5-1.5B; bfloat16 except the
float32 tiny model) one process holds the learner's Trainer and the learner's real ZeroMQ hub
(a thread, as in the learner) and another, as an actor process does, the actor's real fetcher
and engine on its own event loop (uvloop), told of each new version over a pipe:
- sync: from the start of ``export_weights`` to ``engine.update_weights`` returning (the engine
  serves the new weights): export + chunking (crc32) + fetch over tcp loopback (assembled into
  buffers) + the engine's load; the last of three updates is reported, split into parts (warm:
  from the third on the learner writes into chunk buffers the first left, as in a run);
- pause: the part of the load during which the engine generates nothing (drain + load);
- step: a real ``Trainer.train_step`` (decoupled PPO/GRPO, AdamW) on synthetic rollouts of
  ``--groups`` x ``--group-size`` episodes of ``--tokens`` tokens, mean of steps after the first;
  skipped on a CPU for shapes whose full AdamW state does not fit this machine (1.5B: 18 GiB);
  on CUDA (``learner.device = "auto"`` finds it; the hf engine too) every shape trains;
- transfer: update bytes / fetch seconds, against the raw bound: the same bytes in frames of the
  chunks' size over a plain pyzmq PUSH/PULL tcp loopback pair (each frame dropped once received),
  measured in this run.
Writes OUT/real_scale.json and prints a markdown table. Figures are from whatever machine runs
it (docs/benchmarks.md: a 2-core CPU shared with other jobs, so noisy; ratios are within a run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import threading
import time
from pathlib import Path

import numpy as np
import zmq

TRAINABLE = {"tiny", "qwen2.5-0.5b"}


def raw_bound(total: int, frame: int) -> float:
    """GiB/s of ``total`` bytes in ``frame``-byte frames over a tcp loopback PUSH/PULL pair."""
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    buf = bytearray(frame)
    n = max(1, total // frame)
    got = []

    def recv() -> None:
        for _ in range(n):
            got.append(len(pull.recv(copy=False).buffer))

    th = threading.Thread(target=recv)
    t0 = time.perf_counter()
    th.start()
    for _ in range(n):
        push.send(buf, copy=False)
    th.join()
    dt = time.perf_counter() - t0
    push.close(0), pull.close(0), ctx.term()
    return sum(got) / dt / 2**30


def rollouts(vocab: int, groups: int, size: int, tokens: int, seed: int):
    from agentgym.protocol import Episode, Rollout
    from agentgym.protocol.arrays import F32, I32, U8, pack

    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        eps = []
        for i in range(size):
            ids = rng.integers(3, vocab, tokens)
            mask = np.zeros(tokens, np.uint8)
            mask[tokens // 2 :] = 1  # half prompt/observations, half agent tokens
            r = float(i % 2)
            eps.append(
                Episode(
                    token_ids=pack(ids, I32),
                    logprobs=pack(np.full(tokens, -5.0, np.float32), F32),
                    loss_mask=pack(mask, U8),
                    versions=pack(np.where(mask == 1, 0, -1), I32),
                    turn_ends=pack([tokens], I32),
                    turn_rewards=pack([r], F32),
                    reward=r,
                    success=r > 0,
                    finish="done",
                    turn_limit=1,
                )
            )
        out.append(Rollout(group_id=f"g{seed}-{g}", actor_id="bench", env="guess_number", task_id=g, episodes=eps))
    return out


def _actor_process(conn, overrides: list[str], model_dir: str, engine_name: str, addr: str) -> None:
    """An actor's side in its own process: start the engine, then for each WeightsReady that
    comes down ``conn`` fetch the version from ``addr`` and load it; send back the times."""
    import uvloop
    import zmq.asyncio

    from agentgym.actors.engines.builders import make_engine
    from agentgym.actors.weight_fetch import fetch_weights, to_torch
    from agentgym.config import load_config
    from agentgym.host.allocator import keep_freed_memory
    from agentgym.observe.memstats import peak_memory
    from agentgym.protocol.weights import WeightBuffers

    keep_freed_memory()  # as agentgym-actor does at start
    cfg = load_config(None, overrides)

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        engine = make_engine(cfg, Path(model_dir))
        if engine_name == "vllm":
            engine.enforce_eager = True  # no torch.compile: starts sooner; loads are the same
        await engine.start()
        kept = WeightBuffers()  # as the actor keeps its fetch buffers from one update for the next
        conn.send("started")
        try:
            while (ready := await asyncio.to_thread(conn.recv)) is not None:
                t1 = time.perf_counter()
                got, raw = await fetch_weights(ctx, addr, ready, timeout_s=600, into=kept)
                assert got == ready.version
                t2 = time.perf_counter()
                await engine.update_weights(to_torch(raw), got)
                t3 = time.perf_counter()
                del raw
                lu = engine.last_update
                conn.send(
                    {
                        "fetch_s": t2 - t1,
                        "engine_s": t3 - t2,
                        "pause_s": lu["drain_s"] + lu["load_s"],
                        "prepare_s": lu["prepare_s"],
                        "actor_memory": peak_memory(),
                    }
                )
        finally:
            await engine.close()
            ctx.term()

    uvloop.run(main())


def _answer(conn, child, what: str, timeout_s: float = 1800):
    """The actor process's next answer; a clear exit if it dies or stays silent instead."""
    deadline = time.monotonic() + timeout_s
    while not conn.poll(1.0):
        if not child.is_alive():
            raise SystemExit(f"real_scale: the actor process died (exit code {child.exitcode}) before it could {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"real_scale: the actor process did not {what} within {timeout_s:.0f} s")
    return conn.recv()


def _config_overrides(shape: str, model_dir: Path, args: argparse.Namespace) -> tuple[str, list[str]]:
    """The model's dtype for ``shape`` and the config overrides the learner and the actor share."""
    dtype = "float32" if shape == "tiny" else "bfloat16"
    overrides = [
        f'model.path="{model_dir}"',
        f'model.dtype="{dtype}"',
        f'actor.engine="{args.engine}"',
        "actor.kv_cache_gib=0.25",
        f"rollout.max_episode_tokens={max(args.tokens, 256)}",
        "learner.lr=1e-6",
        f"learner.batch_groups={args.groups}",
        f"rollout.group_size={args.group_size}",
        f"learner.gradient_checkpointing={str(args.checkpointing).lower()}",
        "learner.micro_batch_tokens=16384",  # as configs/real_model_gpu.toml: bounds the logits' memory
        "actor.gpu_memory_utilization=0.3",  # vLLM on the learner's GPU: leave it room to train
    ]
    return dtype, overrides


def measure(shape: str, model_dir: Path, args: argparse.Namespace, bound_frame: int) -> dict:
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_transport import HubThread

    from agentgym.config import load_config
    from agentgym.host.netutil import free_port_pair
    from agentgym.learner.training.distributed import DataParallel, pick_device
    from agentgym.learner.training.trainer import Trainer
    from agentgym.learner.training.weight_export import WeightExporter
    from agentgym.learner.transport import WeightSnapshot
    from agentgym.observe.memstats import peak_memory
    from agentgym.protocol import WeightsReady

    dtype, overrides = _config_overrides(shape, model_dir, args)
    cfg = load_config(None, overrides)
    row: dict = {"shape": shape, "dtype": dtype, "engine": args.engine}
    trainer = Trainer.build(cfg, DataParallel(device=pick_device(cfg, 0)))  # learner.device: auto
    row["params"] = sum(p.numel() for p in trainer.model.parameters())
    vocab = trainer.model.config.vocab_size
    steps = args.train_steps if shape in TRAINABLE or trainer.device.type == "cuda" else 0
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        trainer.train_step(rollouts(min(vocab, 500), args.groups, args.group_size, args.tokens, s))
        times.append(time.perf_counter() - t0)
        print(f"{shape}: step {s} {times[-1]:.1f} s", flush=True)
    row["step_s"] = float(np.mean(times[1:] or times)) if times else None
    exporter = WeightExporter(cfg.learner.weight_chunk_mib << 20)
    port = free_port_pair()
    parts: list[dict] = []

    mpc = mp.get_context("spawn")
    conn, child_conn = mpc.Pipe()
    child = mpc.Process(
        target=_actor_process,
        args=(child_conn, overrides, str(model_dir), args.engine, f"tcp://127.0.0.1:{port + 1}"),
        daemon=True,
    )
    with HubThread(f"tcp://127.0.0.1:{port}") as ht:
        child.start()
        if _answer(conn, child, f"start its {args.engine} engine") != "started":
            raise SystemExit("real_scale: the actor process answered something else than 'started'")
        try:
            for version in (1, 2, 3):
                with torch.no_grad():
                    for p in trainer.model.parameters():
                        p.add_(1e-3)  # every tensor changes, as after an optimizer step
                t0 = time.perf_counter()
                chunks, cv = exporter.build(
                    version, trainer.export_weights(dtype, sources=True), trainer.trained_names()
                )
                snap = WeightSnapshot.build(version, chunks)
                del chunks
                export_s = time.perf_counter() - t0
                ht.commands.put(lambda hub, s=snap: hub.publish_weights(s))
                time.sleep(0.05)  # the hub thread picks the command up every 10 ms
                conn.send(
                    WeightsReady(
                        version=version,
                        step=version,
                        turn_limit=3,
                        num_chunks=len(snap.frames),
                        total_bytes=snap.total_bytes,
                        chunk_versions=cv,
                    )
                )
                got = _answer(conn, child, f"load version {version}")
                parts.append(
                    {
                        "bytes": snap.total_bytes,
                        "chunks": len(snap.frames),
                        "export_s": export_s,
                        **got,
                        "sync_s": export_s + got["fetch_s"] + got["engine_s"],
                    }
                )
                print(f"{shape}: update {version} {parts[-1]}", flush=True)
        finally:
            conn.send(None)
            child.join(120)
            if child.is_alive():
                child.kill()
    warm = parts[-1]
    row.update(warm)
    row["fetch_gib_s"] = warm["bytes"] / warm["fetch_s"] / 2**30
    row["sync_over_step"] = warm["sync_s"] / row["step_s"] if row["step_s"] else None
    row["memory"] = peak_memory(children=True)  # the learner's side, and the actor's once it has ended
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="tiny,qwen2.5-0.5b,qwen2.5-1.5b")
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm")
    p.add_argument("--train-steps", type=int, default=3)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--checkpointing", action="store_true", help="learner.gradient_checkpointing")
    p.add_argument("--models", type=Path, default=Path("/tmp/real_scale_models"), help="where made models are kept")
    p.add_argument("--out", type=Path, default=Path("/tmp/real_scale"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from agentgym.config.learner import LearnerConfig
    from agentgym.host.allocator import keep_freed_memory
    from agentgym.models.make import make_model

    keep_freed_memory()  # as the actor process (and agentgym's own) does: the bound gets the same allocator
    frame = LearnerConfig().weight_chunk_mib << 20  # the chunks' size: the bound moves the same frames
    bound = raw_bound(2 << 30, frame)
    print(f"raw pyzmq tcp loopback: {bound:.2f} GiB/s", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        d = args.models / shape
        if not (d / "config.json").is_file():
            make_model(shape, d, seed=0)
        rows.append(measure(shape, d, args, frame))
        rows[-1]["raw_gib_s"] = bound
        rows[-1]["fetch_over_raw"] = rows[-1]["fetch_gib_s"] / bound
        (args.out / "real_scale.json").write_text(json.dumps({"raw_gib_s": bound, "rows": rows}, indent=2))
    print(
        "\n| shape | params | dtype | MiB/update | sync s (export + fetch + engine) | pause s | step s | sync/step | fetch GiB/s | raw GiB/s | fetch/raw |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        step = f"{r['step_s']:.1f}" if r["step_s"] else "not run"
        ratio = f"{r['sync_over_step']:.1%}" if r["sync_over_step"] else "-"
        print(
            f"| {r['shape']} | {r['params'] / 1e6:.1f}M | {r['dtype']} | {r['bytes'] / 2**20:.1f} | "
            f"{r['sync_s']:.2f} ({r['export_s']:.2f} + {r['fetch_s']:.2f} + {r['engine_s']:.2f}) | {r['pause_s']:.2f} | "
            f"{step} | {ratio} | {r['fetch_gib_s']:.2f} | {r['raw_gib_s']:.2f} | {r['fetch_over_raw']:.0%} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
