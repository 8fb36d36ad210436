"""The demo model family for every env (agentgym/models/agent.py): its tokenizer makes each env's
actions a few tokens, every game env can be played at random, and random-play pretraining takes
multi-token actions and env mixes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentgym.config import load_config  # noqa: E402
from agentgym.envpool.registry import resolve_env  # noqa: E402
from agentgym.models.agent import GAME_MIX, SIZES, agent_corpus, make_agent_model  # noqa: E402
from agentgym.models.base import ensure_model, pretrain_on_play  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# Actions of each env and the most tokens each may take (digits are one token each, as in Qwen2).
ACTIONS = {
    "move up": 2,
    "move left": 2,
    "turn left": 2,
    "go forward": 2,
    "pick up": 2,
    "toggle": 2,
    "inventory": 1,
    "get 2 iron ore": 5,
    "craft 4 oak planks using 1 oak log": 10,
    "crane": 2,
    "search[capital of France]": 8,
    "answer[Paris]": 6,
    "click [12]": 6,
    "scroll down": 2,
    "look around": 2,
    "focus on thermometer": 4,
}


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return agent_corpus()


@pytest.fixture(scope="module")
def agent_tiny(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Path:
    return make_agent_model(tmp_path_factory.mktemp("agent") / "tiny", "agent-tiny", corpus=corpus)


def test_actions_are_a_few_tokens_and_round_trip(agent_tiny: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(agent_tiny)
    for action, most in ACTIONS.items():
        ids = tok.encode(action, add_special_tokens=False)
        assert len(ids) <= most, (action, tok.convert_ids_to_tokens(ids))
        assert tok.decode(ids) == action


def test_the_corpus_is_deterministic(corpus: list[str]) -> None:
    assert agent_corpus() == corpus


def test_the_ladder_grows_and_loads(tmp_path: Path, corpus: list[str]) -> None:
    from transformers import AutoModelForCausalLM

    counts = []
    for arch in SIZES:
        model = AutoModelForCausalLM.from_pretrained(make_agent_model(tmp_path / arch, arch, corpus=corpus))
        counts.append(sum(p.numel() for p in model.parameters()))
    assert counts == sorted(counts) and counts[0] < counts[-1]
    with pytest.raises(ValueError, match="unknown arch 'agent-huge'"):
        make_agent_model(tmp_path / "x", "agent-huge", corpus=corpus)


@pytest.mark.parametrize(
    "name, kwargs",
    [(n, k) for n, k, _ in GAME_MIX] + [("deepsearch", {})],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_random_actions_are_valid_and_seeded(name: str, kwargs: dict) -> None:
    env = resolve_env(name)(**kwargs)
    runs = []
    for _ in range(2):
        rng, played = random.Random(3), []
        for task in range(4):
            env.reset(task)
            for _ in range(6):
                action = env.random_action(rng)
                res = env.step(action)
                played.append(action)
                assert res.info.get("valid", True) is not False, (name, action, res.observation)
                if res.done:
                    break
        runs.append(played)
    assert runs[0] == runs[1]  # the same seed, the same actions
    assert len(set(runs[0])) > 1


def test_pretraining_on_a_mix_of_envs(agent_tiny: Path, tmp_path: Path) -> None:
    mix = [("maze", {"size": 3}, 1.0), ("textcraft", {"depth": 1, "distractors": 2}, 2.0)]
    record = pretrain_on_play(agent_tiny, tmp_path / "base", mix, steps=2, seed=0, turns=3)
    assert record["env"] == "maze+textcraft" and record["mix"] == [list(m) for m in mix] and record["turns"] == 3
    assert json.loads((tmp_path / "base" / "pretrain.json").read_text()) == record
    assert record["heldout_loss_after"] < record["heldout_loss_before"]


def test_ensure_model_makes_the_configured_arch_on_the_run_s_envs(tmp_path: Path) -> None:
    path = tmp_path / "m"
    cfg = load_config(
        REPO / "configs" / "envs" / "maze3.toml",
        [f'model.path="{path}"', 'model.arch="agent-tiny"', "model.pretrain_steps=1", "model.pretrain_turns=2"],
    )
    ensure_model(cfg)
    record = json.loads((path / "pretrain.json").read_text())
    assert record["env"] == "maze" and record["env_kwargs"] == {"size": 3} and record["turns"] == 2
    assert record["endings"] is False  # transcripts end at the last action unless the config asks
    ended = tmp_path / "e"
    ensure_model(
        load_config(
            REPO / "configs" / "envs" / "maze3.toml",
            [
                f'model.path="{ended}"',
                'model.arch="agent-tiny"',
                "model.pretrain_steps=1",
                "model.pretrain_endings=true",
            ],
        )
    )
    assert json.loads((ended / "pretrain.json").read_text())["endings"] is True
    assert record["quiz"] is False
    config = json.loads((path / "config.json").read_text())
    assert config["hidden_size"] == SIZES["agent-tiny"]["hidden_size"] and config["vocab_size"] > 1000


def test_a_config_s_base_model_is_the_same_model_each_time_it_is_made(tmp_path: Path) -> None:
    """The results table's rows are rebuilt by making their base anew (model.create_tiny): the same
    config must give the same tokenizer and the same weights, bit for bit, or a row's figures
    belong to a model nobody can make again."""
    from safetensors.torch import load_file

    made = []
    for name in ("a", "b"):
        cfg = load_config(
            REPO / "configs" / "envs" / "maze3.toml",
            [
                f'model.path="{tmp_path / name}"',
                'model.arch="agent-tiny"',
                "model.pretrain_steps=2",
                "model.pretrain_turns=3",
            ],
        )
        ensure_model(cfg)
        made.append(tmp_path / name)
    a, b = (load_file(str(m / "model.safetensors")) for m in made)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), [
        k for k in a if not torch.equal(a[k], b[k])
    ]
    assert (made[0] / "tokenizer.json").read_text() == (made[1] / "tokenizer.json").read_text()
    ra, rb = (json.loads((m / "pretrain.json").read_text()) for m in made)
    assert {k: v for k, v in ra.items() if k != "seconds"} == {k: v for k, v in rb.items() if k != "seconds"}
