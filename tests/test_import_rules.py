"""The import rules of docs/architecture.md hold: import-linter's contracts (pyproject.toml
``[tool.importlinter]``) over the package as installed (scripts/lint_imports.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_import_contract_is_kept() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "lint_imports.py")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout and "KEPT" in proc.stdout, proc.stdout[-2000:]


def test_a_broken_rule_is_reported(tmp_path: Path) -> None:
    """The check sees the packages that live outside agentgym/ (learner/, actors/...): a
    learner module importing a demo model maker breaks two contracts."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import lint_imports
    finally:
        sys.path.pop(0)
    lint_imports.lay_out(tmp_path)
    with (tmp_path / "agentgym" / "learner" / "control" / "staleness.py").open("a") as f:
        f.write("\nfrom agentgym.models.base import ensure_model  # noqa\n")
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run(
        [str(lint), str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "agentgym.learner.control.staleness -> agentgym.models.base" in proc.stdout, proc.stdout[-3000:]
