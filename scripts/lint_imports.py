"""Checks the import rules of docs/architecture.md (``[tool.importlinter]`` in pyproject.toml)
with import-linter; ``scripts/test.sh`` runs it before the tests.

    .venv/bin/python scripts/lint_imports.py          # exit 0: every contract kept

import-linter reads a package from its directory, and agentgym's roles live in top-level
folders that are installed under the ``agentgym`` namespace (``[tool.setuptools.package-dir]``;
docs/adr/0001-import-names.md). So the script lays the installed tree out in a temporary
directory, the ``.py`` files of each folder where the package-dir mapping puts them, and checks
that tree: the graph is the one the installed package has, plus bench/ and scripts/ as
packages of their own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def lay_out(dest: Path) -> None:
    """The package tree as installed: each package-dir folder copied (``.py`` files only) to the
    path its package name gives."""
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package, folder in sorted(tool["package-dir"].items(), key=lambda kv: kv[0].count(".")):
        shutil.copytree(REPO / folder, dest / package.replace(".", "/"), ignore=skip, dirs_exist_ok=True)
    # bench/ and scripts/ are folders of scripts, not packages: laid out as packages ``bench`` and
    # ``scripts`` so the contracts can name them as importers (their imports of each other's
    # files by bare name show as outside packages, which no contract names).
    for folder in ("bench", "scripts"):
        shutil.copytree(
            REPO / folder,
            dest / folder,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.sh", "*.txt", "slurm"),
        )
        (dest / folder / "__init__.py").touch()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="agentgym-imports-") as tmp:
        lay_out(Path(tmp))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH")]))}
        lint = Path(sys.executable).with_name("lint-imports")
        cmd = [str(lint), str(REPO / "pyproject.toml"), "--no-cache", *sys.argv[1:]]
        return subprocess.run(cmd, cwd=tmp, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main())
