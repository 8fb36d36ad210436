"""Actor generation throughput: engines with N concurrent episodes vs a naive transformers loop.

    python bench/engine_bench.py                    # both tiny models, N = 1, 8, 32, 64; ~5 min on 2 cores
    python bench/engine_bench.py --models small --concurrency 1 8 --engines hf
    (the hf engine runs only N <= --hf-max, default 8: it does not batch)

For each model and each N: N episodes, each one agent turn of up to ``--tokens`` sampled
tokens (T = 1, per-episode seeds) from its own chat prompt, run
- through an engine, all N at once (what an actor does: one ``generate`` per episode, awaited
  concurrently on one asyncio loop), and
- naively: one ``transformers`` ``model.generate`` call per episode, one after the other (what
  a simple rollout loop does).
Throughput = generated tokens / wall time (episodes that sample the end-of-sequence token stop
early on both sides; only tokens actually generated count). One run, no repetitions: the
numbers are as noisy as the machine; docs/engines.md holds a table from this script.

Models (random weights, the project's tiny-model maker): ``small`` = the quickstart's model
(hidden 64, 2 layers, head_dim 32, ~0.12M parameters) and ``large`` = the largest that keeps
this 2-core CPU responsive (hidden 256, 4 layers, 4 heads of head_dim 64, ~3M parameters).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

MODELS = {
    "small": dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=192),
    "large": dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=768),
}


def prompts(tokenizer, n: int) -> list[list[int]]:
    from agentgym.actors.play.conversation import Conversation

    return [
        Conversation.start(tokenizer, "You play a guessing game.", f"guess a number from 1 to {8 + i % 50}").prompt_ids
        for i in range(n)
    ]


def naive(model_dir: Path, ps: list[list[int]], tokens: int) -> tuple[int, float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id  # an id or a list of ids (chat models stop on several)
    eos = eos[0] if isinstance(eos, list) else eos
    with torch.inference_mode():
        model.generate(torch.tensor([ps[0]]), do_sample=True, max_new_tokens=4, pad_token_id=eos)  # warm-up
        t0, total = time.perf_counter(), 0
        for i, p in enumerate(ps):
            torch.manual_seed(i)
            out = model.generate(
                torch.tensor([p]),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=tokens,
                pad_token_id=eos,
            )
            total += out.shape[1] - len(p)
    return total, time.perf_counter() - t0


async def through_engine(engine, ps: list[list[int]], tokens: int, tag: str) -> tuple[int, float]:
    from agentgym.actors.engines.engine import SamplingSpec

    t0 = time.perf_counter()
    gens = await asyncio.gather(
        *(
            engine.generate(f"{tag}-{i}", p, SamplingSpec(max_tokens=tokens, temperature=1.0, seed=i))
            for i, p in enumerate(ps)
        )
    )
    return sum(len(g.token_ids) for g in gens), time.perf_counter() - t0


async def run_engine(
    kind: str, model_dir: Path, all_prompts: dict[int, list[list[int]]], tokens: int
) -> dict[int, tuple[int, float]]:
    from agentgym.actors.engines.engine import SamplingSpec

    if kind == "vllm":
        from agentgym.actors.engines.vllm_engine import VllmEngine

        engine = VllmEngine(model_dir, seed=0, kv_cache_gib=0.5, max_model_len=1024)
    else:
        from agentgym.actors.engines.hf_engine import HfEngine

        engine = HfEngine(model_dir, seed=0, max_model_len=1024)
    await engine.start()
    out = {}
    try:
        await engine.generate("warm-up", next(iter(all_prompts.values()))[0], SamplingSpec(max_tokens=8))
        for n, ps in all_prompts.items():
            out[n] = await through_engine(engine, ps, tokens, f"{kind}-{n}")
            print(
                json.dumps({"engine": kind, "episodes": n, "tokens": out[n][0], "seconds": out[n][1]}),
                file=sys.stderr,
                flush=True,
            )
        return out
    finally:
        await engine.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["small", "large"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32, 64])
    ap.add_argument("--engines", nargs="+", choices=["vllm", "hf"], default=["vllm", "hf"])
    ap.add_argument("--tokens", type=int, default=64, help="max sampled tokens per episode")
    ap.add_argument("--hf-max", type=int, default=8, help="largest N run through the (unbatched) hf engine")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)

    import uvloop
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.models.tiny import FALLBACK_CORPUS, default_corpus, make_tiny_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model_dir = make_tiny_model(
                Path(tmp) / name, corpus=default_corpus() + FALLBACK_CORPUS, seed=0, **MODELS[name]
            )
            n_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
            tok = AutoTokenizer.from_pretrained(model_dir)
            all_prompts = {n: prompts(tok, n) for n in args.concurrency}
            results = {}
            for e in args.engines:
                # The reference engine has no batching: beyond a few episodes it only shows that.
                sizes = {n: ps for n, ps in all_prompts.items() if e != "hf" or n <= args.hf_max}
                results[e] = uvloop.run(run_engine(e, model_dir, sizes, args.tokens))
            for n, ps in all_prompts.items():
                base_tokens, base_s = naive(model_dir, ps, args.tokens)
                row = {"model": name, "params": n_params, "episodes": n, "naive_tok_s": base_tokens / base_s}
                for e in args.engines:
                    tokens, secs = results[e].get(n, (float("nan"), 1.0))
                    row[f"{e}_tok_s"] = tokens / secs
                    row[f"{e}_x"] = row[f"{e}_tok_s"] / row["naive_tok_s"]
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)

    heads = " | ".join(f"{e} tok/s | {e} ÷ naive" for e in args.engines)
    print(f"\n| model (params) | episodes | naive generate tok/s | {heads} |")
    print("|---|---:|---:|" + "---:|---:|" * len(args.engines))
    for r in rows:
        cells = " | ".join(
            f"{r[f'{e}_tok_s']:.0f} | {r[f'{e}_x']:.1f}×" if r[f"{e}_tok_s"] == r[f"{e}_tok_s"] else "– | –"
            for e in args.engines
        )
        print(f"| {r['model']} ({r['params'] / 1e6:.2f}M) | {r['episodes']} | {r['naive_tok_s']:.0f} | {cells} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
