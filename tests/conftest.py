"""Fixtures shared by test modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgym.models.tiny import FALLBACK_CORPUS, make_tiny_model


@pytest.fixture(scope="session")
def fallback_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model on the fallback corpus, seed 0: made once per session for every test that
    drives a learner with synthetic rollouts (its tokenizer and vocabulary are all they need)."""
    path = tmp_path_factory.getbasetemp() / "tiny-fallback-seed0"
    if not (path / "config.json").exists():
        make_tiny_model(path, corpus=FALLBACK_CORPUS, seed=0)
    return path
