"""``agentgym config --explain`` lists every field with type, default, bounds and docstring."""

from __future__ import annotations

from agentgym.cli.main import main
from agentgym.config import Config


def _leaf_keys(model: type, prefix: str = "") -> list[str]:
    from pydantic import BaseModel

    out = []
    for name, f in model.model_fields.items():
        tp = f.annotation
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            out += _leaf_keys(tp, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def test_explain_prints_every_field(capsys) -> None:
    assert main(["config", "--explain"]) == 0
    text = capsys.readouterr().out
    for key in _leaf_keys(Config):
        assert f"\n{key}: " in "\n" + text, key
    assert "learner.lr: float = 0.001   (> 0)\n    Peak AdamW learning rate" in text
    assert "rollout.top_p: float = 1.0   (> 0, <= 1)" in text
    assert "[metrics]" in text and "run.dir: Path = runs" in text
    # types as written in the config modules: an optional field's bounds beside it, nested bounds inline
    assert "schedule.threshold: float | None = None   (> 0, <= 1)" in text
    assert "schedule.turn_limits: list[tuple[int>=0, int>=1]] = [(0, 6)]" in text
    assert "Annotated" not in text and "FieldInfo" not in text
