"""Write the tiny random model used by the quickstart and the tests, with its sizes as flags.

    python scripts/make_tiny_model.py --out models/tiny --seed 0

The command over ``agentgym.models.tiny.make_tiny_model`` (see that module for what is written);
``agentgym make-model --arch tiny DIR`` writes the same model with the default sizes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agentgym.models.tiny import FALLBACK_CORPUS, default_corpus, make_tiny_model


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a tiny random Qwen2-style HF model directory.")
    p.add_argument("--out", type=Path, default=Path("models/tiny"), help="output directory")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--intermediate-size", type=int, default=192)
    p.add_argument("--vocab-size", type=int, default=192, help="upper bound on the vocabulary")
    p.add_argument("--max-position", type=int, default=2048)
    args = p.parse_args(argv)
    out = make_tiny_model(
        args.out,
        corpus=default_corpus() + FALLBACK_CORPUS,
        seed=args.seed,
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        intermediate_size=args.intermediate_size,
        vocab_size=args.vocab_size,
        max_position=args.max_position,
    )
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
