"""LoRA on the learner (learner.lora): only the adapters train (and hold AdamW state), the KL
reference is the base model through the same module, a weight version is the adapter alone, and a
checkpoint holds the adapter and resumes bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from learner_fixtures import GOOD, PROMPTS, bandit_rollouts, good_logprob, make_cfg

from agentgym.config import ConfigError
from agentgym.learner.model.logprobs import sequence_logprobs
from agentgym.learner.model.lora import BaseModelView, adapter_state
from agentgym.learner.model.policy import load_causal_lm
from agentgym.learner.training.trainer import Trainer
from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model

LORA = ("learner.lora.rank=4", "learner.lora.alpha=8", "learner.kl_coef=0.05", "learner.lr=2e-2")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("lora") / "m", corpus=FALLBACK_CORPUS, seed=0)


def test_only_the_adapters_train_and_the_reference_is_the_base_model(model_dir: Path) -> None:
    tr = Trainer.load(make_cfg(model_dir, *LORA))
    named = dict(tr.model.named_parameters())
    trained = {n for n, p in named.items() if any(p is q for q in tr.params)}
    assert trained and all(".lora_A." in n or ".lora_B." in n for n in trained), sorted(trained)[:4]
    assert len(trained) == 2 * 7 * tr.model.config.num_hidden_layers  # A and B on 7 projections per layer
    base_before = {n: p.detach().clone() for n, p in named.items() if n not in trained}
    # The reference is a view of the policy with the adapters off: no second copy of the model.
    assert isinstance(tr.ref_model, BaseModelView) and not list(tr.ref_model.parameters())

    before = good_logprob(tr.model, PROMPTS[0])
    ms = [tr.train_step(bandit_rollouts(version=tr.version)) for _ in range(3)]
    assert good_logprob(tr.model, PROMPTS[0]) > before + 0.05  # the adapters learn
    assert ms[0]["kl_ref"] == 0.0 < ms[2]["kl_ref"]  # B starts at zero: version 0 is the base model

    # AdamW state exists for the adapters only, and the base weights never moved.
    assert {id(p) for p in tr.optimizer.state} == {id(named[n]) for n in trained}
    for n, p in tr.model.named_parameters():
        if n in base_before:
            assert torch.equal(p, base_before[n]), n
    base = load_causal_lm(str(model_dir), torch.float32)
    ids = torch.tensor([PROMPTS[1] + [GOOD]])
    with torch.no_grad():
        ref = sequence_logprobs(tr.ref_model, ids, torch.ones_like(ids))
        torch.testing.assert_close(ref, sequence_logprobs(base, ids, torch.ones_like(ids)), rtol=0, atol=1e-6)
        assert not torch.allclose(ref, sequence_logprobs(tr.model, ids, torch.ones_like(ids)))

    # A weight version is the adapter: peft's names, float32 bytes of the A/B matrices only.
    raw = tr.export_weights()
    state = adapter_state(tr.model)
    assert [t.name for t in raw] == list(state) and all(n.startswith("base_model.model.") for n in state)
    adapter_bytes = sum(len(t.data) for t in raw)
    assert adapter_bytes == sum(t.numel() * 4 for t in state.values())
    full_bytes = sum(p.numel() * 4 for n, p in named.items() if n not in trained)
    assert adapter_bytes < full_bytes / 5


def test_checkpoint_holds_the_adapter_and_resumes_bit_for_bit(model_dir: Path, tmp_path: Path) -> None:
    cfg = make_cfg(model_dir, *LORA, "learner.lr_schedule=linear")
    straight = Trainer.load(cfg)
    m_straight = [straight.train_step(bandit_rollouts(version=straight.version)) for _ in range(4)]

    first = Trainer.load(cfg)
    m_first = [first.train_step(bandit_rollouts(version=first.version)) for _ in range(2)]
    ckpt = tmp_path / "checkpoints" / "step_000002"
    first.save(ckpt, {"seen": ["g0"]})
    files = {p.name for p in ckpt.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json"} <= files and "model.safetensors" not in files
    second = Trainer.load(cfg)
    assert second.load_checkpoint(ckpt) == {"seen": ["g0"]} and (second.step, second.version) == (2, 2)
    m_second = [second.train_step(bandit_rollouts(version=second.version)) for _ in range(2)]

    drop = lambda ms: [{k: v for k, v in m.items() if k != "train_time_s"} for m in ms]  # noqa: E731
    assert drop(m_first + m_second) == drop(m_straight)
    a, b = adapter_state(second.model), adapter_state(straight.model)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    other = Trainer.load(make_cfg(model_dir, *LORA[1:], "learner.lora.rank=8"))
    with pytest.raises(ValueError, match="does not match learner.lora"):
        other.load_checkpoint(ckpt)


def test_lora_config_is_checked(model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="lora needs learner.dp_mode"):
        make_cfg(model_dir, "learner.lora.rank=4", 'learner.dp_mode="fsdp"')
    with pytest.raises(ValueError, match="no modules named"):
        Trainer.load(make_cfg(model_dir, "learner.lora.rank=4", 'learner.lora.target_modules=["q_proj", "qkv"]'))


def test_an_actor_engine_that_cannot_serve_adapters_is_refused(model_dir: Path) -> None:
    from agentgym.actors.engines.builders import make_engine
    from agentgym.learner.model.lora import lora_spec

    cfg = make_cfg(model_dir, "learner.lora.rank=4", 'actor.engine="remote"', 'actor.remote.url="http://127.0.0.1:1"')
    spec = lora_spec(cfg)
    assert spec is not None and spec.rank == 4 and lora_spec(make_cfg(model_dir)) is None
    with pytest.raises(ValueError, match="cannot serve the learner's LoRA adapters"):
        make_engine(cfg, model_dir, lora=spec)
