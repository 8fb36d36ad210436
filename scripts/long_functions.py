"""Lists the functions over a line limit (default 100) in the
package folders, bench/ and scripts/; exit 1 when there is one.

    .venv/bin/python scripts/long_functions.py [LIMIT]

A function's lines run from its ``def`` to its last line, docstring and comments included.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ["agentgym", "actors", "learner", "envpool", "protocol", "bench", "scripts"]


def long_functions(limit: int) -> list[tuple[int, str]]:
    """(lines, "path:line:name") of every function longer than ``limit`` lines, longest first."""
    found = []
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > limit:
                        found.append((lines, f"{path.relative_to(REPO)}:{node.lineno}:{node.name}"))
    return sorted(found, reverse=True)


def main() -> int:
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    found = long_functions(limit)
    for lines, where in found:
        print(f"{lines:5d}  {where}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
