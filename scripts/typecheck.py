"""Type-checks the training path (``protocol``, ``envpool``, ``actors``, ``learner``) with mypy
(``[tool.mypy]`` in pyproject.toml); ``scripts/test.sh`` runs it before the tests.

    .venv/bin/python scripts/typecheck.py          # exit 0: no type errors; extra arguments go to mypy

mypy finds a module by its path, and agentgym's roles live in top-level folders that are installed
under the ``agentgym`` namespace (``[tool.setuptools.package-dir]``; docs/adr/0001-import-names.md),
which the editable install's import hook maps and mypy cannot see. So the script links each role's
folder where its package name puts it, under ``.mypy_cache/src/agentgym/``, points mypy there, and
prints its findings with the repository's own paths (``learner/training/trainer.py``, not the link's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / ".mypy_cache" / "src"
CHECKED = ["agentgym.protocol", "agentgym.envpool", "agentgym.actors", "agentgym.learner"]


def link_roles() -> dict[str, str]:
    """Links ``.mypy_cache/src/agentgym/<role>`` to each top-level role folder; returns the link
    prefixes to rewrite in mypy's output, each mapped to the folder's own path."""
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top = SRC / "agentgym"
    top.mkdir(parents=True, exist_ok=True)
    init = top / "__init__.py"
    if not init.is_symlink():
        init.symlink_to(os.path.relpath(REPO / "agentgym" / "__init__.py", top))
    rewrite = {}
    for package, folder in dirs.items():
        parts = package.split(".")
        if len(parts) != 2 or parts[0] != "agentgym":
            continue  # the namespace itself, and sub-packages that sit inside their parent's folder
        link = top / parts[1]
        target = os.path.relpath(REPO / folder, top)
        if not link.is_symlink() or os.readlink(link) != target:
            link.unlink(missing_ok=True)
            link.symlink_to(target, target_is_directory=True)
        rewrite[f"{link.relative_to(REPO)}/"] = f"{folder}/"
    return rewrite


def main() -> int:
    rewrite = link_roles()
    env = {**os.environ, "MYPYPATH": str(SRC)}
    cmd = [sys.executable, "-m", "mypy", *(a for m in CHECKED for a in ("-p", m)), *sys.argv[1:]]
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout.splitlines():
        for link, folder in rewrite.items():
            if line.startswith(link):
                line = folder + line[len(link) :]
                break
        print(line)
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
