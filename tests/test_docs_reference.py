"""The README and docs/ as a reader meets them: two set-up commands at the top, a link to every
page of docs/, no statement about files that do not exist, no wording that only made sense to
the people who wrote it, and no path of one particular machine."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])


def test_readme_opens_with_exactly_two_set_up_commands() -> None:
    first = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first and README.index(first.group(0)) < 50
    commands = [line for line in first.group(1).splitlines() if line.strip()]
    assert [c.split("#")[0].strip() for c in commands] == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]


def test_readme_links_every_doc() -> None:
    docs = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    missing = [d for d in docs if f"docs/{d}" not in README]
    assert not missing and "docs/adr/" in README, missing


def test_referenced_test_files_and_docs_exist() -> None:
    for page in PAGES:
        text = page.read_text()
        for ref in sorted(set(re.findall(r"\btests/test_\w+\.py", text))):
            assert (REPO / ref).is_file(), f"{page.relative_to(REPO)} cites {ref}, which does not exist"
        for ref in sorted(set(re.findall(r"\bdocs/[\w./-]+\.md", text))):
            assert (REPO / ref).is_file(), f"{page.relative_to(REPO)} cites {ref}, which does not exist"


def test_no_wording_for_insiders_nor_machine_paths() -> None:
    bad = re.compile(
        r"\bissue \d+|\bthe issue\b|\bthis round\b|\bthis session\b|source documents|/work/\w+|"
        r"checkpoints/step_N\b|step-0\d+",
        re.I,
    )
    found = [f"{p.relative_to(REPO)}: {m.group(0)!r}" for p in PAGES for m in bad.finditer(p.read_text())]
    assert not found, found


def test_architecture_names_every_module_of_the_training_path() -> None:
    """docs/architecture.md's module tables name every module of the two roles (subfolders
    included) and of envpool/ and protocol/ (their top level; the envs are docs/environments.md's)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    modules = [p for role in ("actors", "learner") for p in (REPO / role).rglob("*.py")]
    modules += [p for folder in ("envpool", "protocol") for p in (REPO / folder).glob("*.py")]
    paths = sorted(str(p.relative_to(REPO)) for p in modules if p.name != "__init__.py")
    assert len(paths) > 70, paths  # the folders were found
    missing = [p for p in paths if f"`{p}`" not in text]
    assert not missing, f"docs/architecture.md does not name {missing}: add a row to its module tables"
