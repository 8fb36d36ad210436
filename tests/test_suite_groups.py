"""The suite's own scheduling (tests/conftest.py): every name it lists still names tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import HOSTS_GROUP, HOSTS_MODULES, LONG_FIRST, SPLIT_MODULES, _group_of, _rank

TESTS = Path(__file__).resolve().parent


def test_every_listed_module_exists() -> None:
    for module in HOSTS_MODULES | SPLIT_MODULES:
        assert (TESTS / f"{module}.py").exists(), f"tests/conftest.py lists {module}, which is not a test module"


def test_each_long_group_names_collected_tests(request: pytest.FixtureRequest) -> None:
    ids = [item.nodeid for item in request.session.items]
    if len(ids) < 50:  # run alone: the rest of the suite was not collected
        pytest.skip("needs the whole suite's collection (bash scripts/test.sh)")
    for rank, key in enumerate(LONG_FIRST):
        assert any(_rank(i) == rank for i in ids), f"LONG_FIRST's {key!r} matches no test"


def test_groups_keep_modules_together_and_split_the_listed_ones() -> None:
    assert _group_of("tests/test_relay.py::test_x") == HOSTS_GROUP == _group_of("tests/test_slurm.py::test_y[a]")
    assert _group_of("tests/test_chat_templates.py::test_a[x]") == _group_of("tests/test_chat_templates.py::test_b")
    one, two = "tests/test_e2e.py::test_a", "tests/test_e2e.py::test_b"
    assert _group_of(one) != _group_of(two)
    assert _rank("tests/test_e2e.py::test_an_actor_killed_mid_run_is_replaced") < _rank(
        "tests/test_chat_templates.py::test_a"
    )
    assert _rank("tests/test_slurm.py::test_y") == 0
