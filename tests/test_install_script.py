"""scripts/install.sh's AGENTGYM_SKIP_SYSTEM_PACKAGES=1: the Debian packages are skipped with a
line naming them and what needs them, and the install goes on (here it stops right after, at the
venv, because the interpreter it is given is `false`: nothing is installed by this test)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_skip_system_packages_goes_on_without_apt(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "install.sh", tmp_path / "scripts" / "install.sh")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "scripts" / "system-packages.txt").write_text("agentgym-no-such-package  # a comment\n")
    env = {
        **os.environ,
        "AGENTGYM_SKIP_SYSTEM_PACKAGES": "1",
        "PYTHON": "false",
        "AGENTGYM_VENV": str(tmp_path / "venv"),
        "AGENTGYM_DEVICE": "cpu",
    }
    proc = subprocess.run(
        ["bash", "scripts/install.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert "AGENTGYM_SKIP_SYSTEM_PACKAGES=1, not installing agentgym-no-such-package" in proc.stderr, proc.stderr
    assert "apt-get install" not in proc.stdout and "installing into" in proc.stdout, proc.stdout  # went on to the venv
    assert proc.returncode != 0 and not (tmp_path / "venv").exists()  # `false -m venv` stopped it there
