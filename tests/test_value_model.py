"""PPO's separate critic (learner.value_model = "separate"): it learns, it is separate from the
policy, it never reaches the actors, checkpoints restore it, and the combinations it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from learner_fixtures import BAD, GOOD, PROMPTS, bandit_rollouts, episode, make_cfg, params_equal

from agentgym.config import ConfigError, load_config
from agentgym.learner.model.policy import forward_tokens
from agentgym.learner.model.value_model import SeparateValueModel, ValueHead
from agentgym.learner.training.batch import collate
from agentgym.learner.training.trainer import Trainer
from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model
from agentgym.protocol import Rollout

SEPARATE = ("learner.algorithm=ppo", 'learner.value_model="separate"')


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("value_model") / "m", corpus=FALLBACK_CORPUS, seed=0)


def prompt_valued_rollouts(version: int) -> list[Rollout]:
    """Every episode of PROMPTS[0] earns 1, every one of PROMPTS[1] earns 0, whatever it plays:
    the return is a function of the prompt alone, which a critic can learn exactly."""
    out = []
    for gi, prompt in enumerate(PROMPTS):
        eps = [episode(prompt, [[GOOD if i % 2 else BAD]], [1.0 - gi], version=version) for i in range(4)]
        out.append(Rollout(group_id=f"g{gi}", actor_id="a", env="bandit", task_id=gi, episodes=eps))
    return out


def test_the_separate_critic_learns_the_values_of_a_fixed_batch(model_dir: Path) -> None:
    tr = Trainer.load(make_cfg(model_dir, *SEPARATE, "learner.lr=1e-5", "learner.value_lr=2e-3"))
    assert isinstance(tr.value_head, SeparateValueModel)
    ms = [tr.train_step(prompt_valued_rollouts(tr.version)) for _ in range(25)]
    assert ms[0]["explained_variance"] == pytest.approx(0.0, abs=1e-6)  # V = 0 everywhere at the start
    assert ms[-1]["explained_variance"] > 0.9, [round(m["explained_variance"], 3) for m in ms]
    assert ms[-1]["value_loss"] < 0.05 * ms[0]["value_loss"]
    assert ms[-1]["value_grad_norm"] > 0 and ms[-1]["grad_norm"] > 0


def test_the_value_loss_reaches_the_critic_only(model_dir: Path) -> None:
    tr = Trainer.load(make_cfg(model_dir, *SEPARATE))
    b = collate(bandit_rollouts(), tr.pad_id)
    # Give the zero-initialised head a weight, or no gradient would flow below it.
    torch.nn.init.normal_(tr.value_head.head.linear.weight)
    f = forward_tokens(tr.model, b.input_ids, b.attention_mask, 1.0, value_head=tr.value_head)
    (f.values.sum() + f.last_value.sum()).backward()
    assert all(p.grad is None for p in tr.model.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in tr.value_head.parameters())
    # Not a view of the policy: the critic's body holds its own tensors.
    policy_ptrs = {p.data_ptr() for p in tr.model.parameters()}
    assert not policy_ptrs & {p.data_ptr() for p in tr.value_head.parameters()}


def test_the_policy_step_does_not_depend_on_the_value_loss(model_dir: Path) -> None:
    # Step 1 (V = 0 in both, so the same advantages): the value loss's weight changes the critic's
    # step and not the policy's, bit for bit; the two optimizers' clips are separate too.
    a = Trainer.load(make_cfg(model_dir, *SEPARATE, "learner.value_coef=0.5"))
    b = Trainer.load(make_cfg(model_dir, *SEPARATE, "learner.value_coef=4.0"))
    ma, mb = a.train_step(bandit_rollouts(a.model)), b.train_step(bandit_rollouts(b.model))
    assert params_equal(a.model, b.model) and ma["grad_norm"] == mb["grad_norm"]
    assert not params_equal(a.value_head, b.value_head) and ma["value_grad_norm"] != mb["value_grad_norm"]


def test_the_actors_get_the_policy_weights_only(model_dir: Path) -> None:
    tr = Trainer.load(make_cfg(model_dir, *SEPARATE))
    exported = {t.name for t in tr.export_weights()}
    plain = {t.name for t in Trainer.load(make_cfg(model_dir, "learner.algorithm=grpo")).export_weights()}
    assert exported == plain
    # With LoRA the critic is a full copy of the body (taken before the adapters wrap the policy)
    # and trains; the actors still get the adapters only.
    lora = Trainer.load(make_cfg(model_dir, *SEPARATE, "learner.lora.rank=4"))
    body_before = [p.detach().clone() for p in lora.value_head.body.parameters()]
    for _ in range(2):  # the zero-initialised head first, then the body below it
        lora.train_step(bandit_rollouts(version=lora.version))
    changed = [not torch.equal(a, b) for a, b in zip(body_before, lora.value_head.body.parameters(), strict=True)]
    assert all(changed), changed
    assert all("lora_" in t.name for t in lora.export_weights())


def test_a_checkpoint_restores_the_separate_critic(model_dir: Path, tmp_path: Path) -> None:
    """3 steps == 2 steps + save + a fresh Trainer + load + 1 step: same metrics, same weights."""
    cfg = make_cfg(model_dir, *SEPARATE, "learner.value_lr=3e-2")
    straight = Trainer.load(cfg)
    m_straight = [straight.train_step(bandit_rollouts(version=straight.version)) for _ in range(3)]
    first = Trainer.load(cfg)
    m_first = [first.train_step(bandit_rollouts(version=first.version)) for _ in range(2)]
    first.save(tmp_path / "step_000002")
    second = Trainer.load(cfg)
    assert not params_equal(second.value_head, first.value_head)
    second.load_checkpoint(tmp_path / "step_000002")
    assert params_equal(second.value_head, first.value_head)
    m_second = [second.train_step(bandit_rollouts(version=second.version))]
    drop = lambda ms: [{k: v for k, v in m.items() if k != "train_time_s"} for m in ms]  # noqa: E731
    assert drop(m_first + m_second) == drop(m_straight)
    assert params_equal(second.model, straight.model) and params_equal(second.value_head, straight.value_head)
    # A checkpoint of the other critic does not resume this one (nor the reverse).
    shared = Trainer.load(make_cfg(model_dir, "learner.algorithm=ppo"))
    assert isinstance(shared.value_head, ValueHead)
    with pytest.raises(ValueError, match="learner.value_model = 'separate'"):
        shared.load_checkpoint(tmp_path / "step_000002")
    shared.save(tmp_path / "shared")
    with pytest.raises(ValueError, match="learner.value_model = 'shared'"):
        Trainer.load(cfg).load_checkpoint(tmp_path / "shared")


def test_fsdp_with_a_separate_critic_is_refused_naming_the_fields() -> None:
    with pytest.raises(ConfigError, match=r"learner.value_model = 'separate' needs learner.dp_mode = 'replicate'"):
        load_config(None, [*SEPARATE, 'learner.dp_mode="fsdp"', "learner.dp_size=2"])
    with pytest.raises(ConfigError, match="value_model"):
        load_config(None, ['learner.value_model="own"'])
    load_config(None, ['learner.value_model="separate"', 'learner.dp_mode="fsdp"'])  # not ppo: no critic
