"""Does the asynchronous learner wait for data? Utilisation against model size, K and actor count.

    python bench/learner_utilisation.py --out /tmp/util
    python bench/learner_utilisation.py --hidden 0,128 --staleness 2,4 --actors 1,2,3 --steps 40

Each cell is one ``agentgym bench --modes async`` run (a real learner and real actor processes
over loopback) on the env that waits (guess_number, every step sleeping a log-normal time, median
0.3 s), with simulated engines in the actors (``actor.engine = "sim"``, actors/engines/sim_engine.py):
everything of an actor is real (tickets, env pool, rollouts, weight fetches) except the model, so
the actors take almost no CPU from the learner, as actors on their own machines or GPUs would not.
The learner trains a real model: the quickstart's tiny one (``--hidden 0``) or a random Qwen2-style
model of ``--hidden`` width and ``--layers`` layers made here with the tiny model's tokenizer, so
its step takes longer.

What to expect (Little's law): a learner stepping every T seconds on B groups, each taking L
seconds to play, needs B x L / T groups in flight; async admission holds at most B x (K + 1)
(docs/off_policy.md, "The staleness bound"), and each actor at most ``actor.max_groups``. Below
either, the learner waits. Prints a markdown table and writes OUT/learner_utilisation.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WAITING_ENV = "env.kwargs={low=1, high=8, step_latency_s=0.3, latency_sigma=1.0}"


def make_model(out: Path, hidden: int, layers: int) -> int:
    """A random Qwen2-style model with the tiny model's tokenizer; returns its parameter count."""
    import torch
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    tiny = ROOT / "models" / "tiny"
    if not (tiny / "config.json").exists():
        subprocess.run([sys.executable, "-m", "agentgym.cli", "make-model", "--arch", "tiny", str(tiny)], check=True)
    ref = AutoConfig.from_pretrained(tiny)
    cfg = Qwen2Config(
        vocab_size=ref.vocab_size,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 256),
        max_position_embeddings=ref.max_position_embeddings,
        eos_token_id=ref.eos_token_id,
        pad_token_id=ref.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        use_sliding_window=False,
        max_window_layers=layers,
    )
    cfg.architectures = ["Qwen2ForCausalLM"]
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out)
    for f in tiny.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "generation_config")):
            shutil.copy(f, out / f.name)
    return sum(p.numel() for p in model.parameters())


def run_cell(out: Path, model: Path, k: int, actors: int, steps: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "bench",
        "--modes",
        "async",
        "--steps",
        str(steps),
        "--actors",
        str(actors),
        "--out",
        str(out),
        "-o",
        "actor.engine=sim",
        "-o",
        f"model.path={model}",
        "-o",
        "model.create_tiny=false",
        "-o",
        f"learner.max_staleness={k}",
        "-o",
        WAITING_ENV,
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    mean = json.loads((out / "comparison.json").read_text())["mean"]["async"]
    rows = [json.loads(line) for line in (out / "async-0" / "metrics.jsonl").read_text().splitlines()]
    settled = rows[len(rows) // 4 :] or rows  # after the pipeline has filled
    return {
        **mean,
        "step_s": statistics.median(r["train_time_s"] for r in rows),
        "in_flight": statistics.mean(r["tickets_in_flight"] for r in settled),
        "buffered": statistics.mean(r["buffered_groups"] for r in settled),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", default="0,128", help="learner model widths; 0: the quickstart's tiny model")
    ap.add_argument("--layers", type=int, default=4, help="layers of the models made here")
    ap.add_argument("--staleness", default="2,4", help="learner.max_staleness values (K)")
    ap.add_argument("--actors", default="1,2", help="actor process counts")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="learner_util_"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for hidden in (int(h) for h in a.hidden.split(",")):
        model, params = ROOT / "models" / "tiny", None
        if hidden:
            model = out / f"model_h{hidden}_l{a.layers}"
            params = make_model(model, hidden, a.layers)
        for k, n in itertools.product((int(x) for x in a.staleness.split(",")), (int(x) for x in a.actors.split(","))):
            cell = run_cell(out / f"h{hidden}_k{k}_n{n}", model, k, n, a.steps)
            results.append({"hidden": hidden, "params": params, "k": k, "actors": n, **cell})
            print(f"hidden={hidden} K={k} actors={n}: utilisation {cell['learner_utilisation']:.3f}", flush=True)
    (out / "learner_utilisation.json").write_text(json.dumps(results, indent=1))
    print(
        "\n| learner model | step (s) | K | actors | in flight + buffered | utilisation | waiting | staleness | lost |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        name = (
            "tiny (quickstart)"
            if not r["hidden"]
            else f"hidden {r['hidden']}, {a.layers} layers ({r['params'] / 1e6:.2f}M)"
        )
        print(
            f"| {name} | {r['step_s']:.2f} | {r['k']} | {r['actors']} | {r['in_flight']:.1f} + {r['buffered']:.1f} | "
            f"{r['learner_utilisation']:.2f} | {r['learner_wait_frac']:.2f} | {r['staleness_mean']:.2f} | {r['lost_frac']:.3f} |"
        )
    print(f"\nruns in {out}")


if __name__ == "__main__":
    main()
