"""Type-checks the whole ``agentgym`` package with mypy (``[tool.mypy]`` in pyproject.toml): the roles
(``protocol``, ``envpool``, ``actors``, ``learner``) and ``agentgym/``'s own packages (``cli``,
``cluster``, ``config``, ``models``, ``host``, ``observe``, ``auth``); ``scripts/test.sh`` runs it
beside the tests.

    .venv/bin/python scripts/typecheck.py          # exit 0: no type errors; extra arguments go to mypy

mypy finds a module by its path, and agentgym's roles live in top-level folders that are installed
under the ``agentgym`` namespace (``[tool.setuptools.package-dir]``; docs/adr/0001-import-names.md),
which the editable install's import hook maps and mypy cannot see. So the script lays the package
out as it is installed, under ``.mypy_cache/src/agentgym/``: a link to each role's folder where its
package name puts it, and one to each package in ``agentgym/``. It points mypy there, checks
``agentgym`` and everything below it, and prints the findings with the repository's own paths
(``learner/training/trainer.py``, ``agentgym/cli/main.py``, not the links').
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / ".mypy_cache" / "src"


def _link(link: Path, folder: str, rewrite: dict[str, str]) -> None:
    """Points ``link`` at the repository's ``folder`` and records the pair for ``rewrite``."""
    target = os.path.relpath(REPO / folder, link.parent)
    if not link.is_symlink() or os.readlink(link) != target:
        link.unlink(missing_ok=True)
        link.symlink_to(target, target_is_directory=True)
    rewrite[f"{link.relative_to(REPO)}/"] = f"{folder}/"


def link_package() -> dict[str, str]:
    """Links ``.mypy_cache/src/agentgym/<name>`` to each top-level role folder and to each package
    in ``agentgym/``; returns the link prefixes to rewrite in mypy's output, each mapped to the
    folder's own path."""
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top = SRC / "agentgym"
    top.mkdir(parents=True, exist_ok=True)
    init = top / "__init__.py"
    if not init.is_symlink():
        init.symlink_to(os.path.relpath(REPO / "agentgym" / "__init__.py", top))
    rewrite: dict[str, str] = {}
    for package, folder in dirs.items():
        parts = package.split(".")
        if len(parts) != 2 or parts[0] != "agentgym":
            continue  # the namespace itself, and sub-packages that sit inside their parent's folder
        _link(top / parts[1], folder, rewrite)
    for init_py in sorted((REPO / "agentgym").glob("*/__init__.py")):
        _link(top / init_py.parent.name, f"agentgym/{init_py.parent.name}", rewrite)
    return rewrite


def main() -> int:
    rewrite = link_package()
    env = {**os.environ, "MYPYPATH": str(SRC)}
    cmd = [sys.executable, "-m", "mypy", "-p", "agentgym", *sys.argv[1:]]
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
