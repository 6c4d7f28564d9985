"""The docs are a manual of the code as it is: the history of a change lives in git and CHANGELOG.md.

Every tracked text file but the changelog and recorded data is searched for the wording of a lab notebook:
a development step ("this stop", "two stops ago", "last round", "this wave", "this change"), an issue number
used as a reference or a section title, a scratch path, or the project's private reading material."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from support import ROOT

HISTORY = re.compile(
    r"\b(?:\w+ )?stops? ago\b"
    r"|\b(?:this|last|previous|the last) stop(?:'s)?\b"
    r"|\b(?:this|last|previous) (?:round|wave)\b"
    r"|\bthis change\b"
    r"|\bissue ?#?\d+\b"
    r"|\b(?:second|third) (?:adversarial )?review\b"
    r"|/work/|\.\./shared\b|\bshared/(?:seeds|reference)\b|\bthe seeds\b",
    re.IGNORECASE,
)
TITLE_ISSUE = re.compile(r"^#+ .*\b(?:issues?|targets \(|changes? since)\b", re.IGNORECASE | re.MULTILINE)  # a section named for a change
SKIP = ("CHANGELOG.md", "tests/fixtures/", "tests/golden/", "tests/docs/test_manual_wording.py")
TEXT = (".md", ".py", ".sh", ".yaml", ".yml", ".toml", ".json", ".txt", ".cfg", ".j2", ".tpl")


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # an unpacked archive: every file under the root
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    return [ROOT / n for n in names if n.endswith(TEXT) and not n.startswith(SKIP) and (ROOT / n).is_file()]


def _hits(text: str, markdown: bool = True) -> list[str]:
    found = [m.group(0) for m in HISTORY.finditer(text)]
    return found + ([m.group(0) for m in TITLE_ISSUE.finditer(text)] if markdown else [])


def test_no_file_reads_like_a_lab_notebook() -> None:
    offenders = {}
    for path in _tracked():
        hits = _hits(path.read_text(encoding="utf-8", errors="replace"), markdown=path.suffix == ".md")
        if hits:
            offenders[path.relative_to(ROOT).as_posix()] = sorted(set(hits))[:5]
    assert not offenders, offenders


def test_readme_and_docs_are_searched() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _tracked()}
    assert {"README.md", "docs/physics.md", "docs/performance.md", "agent/cli.py"} <= names


@pytest.mark.parametrize("text", [
    "Three stops ago the loop read", "This stop's change", "the last round's figures", "(issue 28)",
    "## Targets (issue 28)", "## Issues closed", "### Changes since 0.1", "After a second adversarial review:", "see ../shared/seeds/roofline.md",
    "this wave's code", "a /work/scratch prototype",
])
def test_the_search_finds_history(text: str) -> None:
    assert _hits(text)


@pytest.mark.parametrize("text", [
    "a worker that stops is replaced", "the engine stops answering", "round robin over the ranks",
    "a known issue in vLLM", "the stop sequence", "### What the round trip costs", "## Stopping the agent", "rounds of 20 calls", "this changes nothing",
])
def test_the_search_leaves_present_tense_alone(text: str) -> None:
    assert not _hits(text)
