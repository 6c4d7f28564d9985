"""Every fixed mutant (mutants.py) is killed: applied to a copy of the checkout, its tests fail.

The copy is imported as `rooflight` through a folder of links laid out as the installed package is
(pyproject.toml's package-dir), first on PYTHONPATH: sys.path comes before the editable install's finder.
The copy's tests pass unmutated first (a failing baseline would make every mutant look killed); a mutant
whose tests stop with anything but test failures (a collection or usage error) is not counted as killed.
All run one after another in one xdist worker (one copy).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from mutants import MUTANTS, Mutant
from support import ROOT

pytestmark = [pytest.mark.xdist_group("mutants"), pytest.mark.prometheus]

PARTS = {"agent": "agent", "collectors": "collectors", "rules": "rules", "dashboards": "dashboards"}
SKIP = shutil.ignore_patterns(".venv*", ".git", "__pycache__", "build", "dist", "*.egg-info", ".hypothesis",
                              ".pytest_cache", "node_modules", ".cache")
PYTEST_FAILED = 1  # pytest's exit code when tests ran and some failed


class Sandbox:
    """A copy of the checkout and the PYTHONPATH under which `rooflight` is that copy."""

    def __init__(self, base: Path) -> None:
        self.root = base / "checkout"
        shutil.copytree(ROOT, self.root, ignore=SKIP, symlinks=True)
        shim = base / "shim" / "rooflight"
        shim.mkdir(parents=True)
        for name in ("__init__.py", "__main__.py"):
            shutil.copy(self.root / "agent" / "_root" / name, shim / name)
        for package, folder in PARTS.items():
            (shim / package).symlink_to(self.root / folder, target_is_directory=True)
        self.env = {**os.environ, "PYTHONPATH": f"{shim.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                    "PYTHONDONTWRITEBYTECODE": "1"}

    def run(self, *args: str, timeout: float = 240, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=cwd or self.root, env=self.env, capture_output=True, text=True, timeout=timeout)

    def pytest(self, tests: list[str]) -> subprocess.CompletedProcess[str]:
        # without Hypothesis's plugin: importing it is 1.2 of a run's 2.9 s (-X importtime); a test file that
        # uses Hypothesis imports it itself
        return self.run(sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "-p", "no:hypothesispytest", "--timeout", "120", *tests)

    def check(self, mutant: Mutant) -> list[str]:
        """What each of the mutant's test commands answered: 'failed', 'passed' or 'error: ...'."""
        answers = []
        unit = [t for t in mutant.tests if not t.startswith("promtool:")]
        if unit:
            r = self.pytest(unit)
            answers.append("failed" if r.returncode == PYTEST_FAILED else "passed" if r.returncode == 0
                           else f"error {r.returncode}: {(r.stdout + r.stderr)[-800:]}")
        for t in mutant.tests:
            if t.startswith("promtool:"):
                rules_file = self.root / t.removeprefix("promtool:")
                r = self.run("promtool", "test", "rules", rules_file.name, timeout=300, cwd=rules_file.parent)
                answers.append("failed" if "FAILED" in r.stdout + r.stderr else
                               "passed" if r.returncode == 0 else f"error {r.returncode}: {r.stderr[-800:]}")
        return answers


@pytest.fixture(scope="session")  # one copy for the worker's whole run, were other modules run between
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    if shutil.which("promtool") is None and any(t.startswith("promtool:") for m in MUTANTS for t in m.tests):
        pytest.skip("promtool not installed (Debian's prometheus package)")
    box = Sandbox(tmp_path_factory.mktemp("mutants"))
    unit = sorted({t for m in MUTANTS for t in m.tests if not t.startswith("promtool:")})
    baseline = box.pytest(unit)
    assert baseline.returncode == 0, f"the mutants' tests fail unmutated:\n{baseline.stdout[-3000:]}"
    for rules_test in sorted({t.removeprefix("promtool:") for m in MUTANTS for t in m.tests if t.startswith("promtool:")}):
        r = box.run("promtool", "test", "rules", Path(rules_test).name, cwd=box.root / Path(rules_test).parent)
        assert r.returncode == 0, f"{rules_test} fails unmutated:\n{(r.stdout + r.stderr)[-3000:]}"
    yield box


def test_every_mutant_is_a_single_edit_of_a_file_that_exists() -> None:
    keys = [m.key for m in MUTANTS]
    assert len(keys) == len(set(keys)), "two mutants share a key"
    for m in MUTANTS:
        text = (ROOT / m.path).read_text()
        assert text.count(m.old) == 1, f"{m.key}: {m.path} holds its text {text.count(m.old)} times, not once: rewrite it against the code"
        assert m.old != m.new and m.tests and m.hurts


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.key)
def test_the_mutant_is_killed(sandbox: Sandbox, mutant: Mutant) -> None:
    path = sandbox.root / mutant.path
    original = path.read_text()
    rules = {p: p.read_bytes() for p in (sandbox.root / "rules").glob("*.yaml")}
    assert original.count(mutant.old) == 1, f"{mutant.key}: its text is not in {mutant.path} once"
    path.write_text(original.replace(mutant.old, mutant.new))
    try:
        if mutant.regenerates_rules:
            generated = sandbox.run(sys.executable, "-m", "rooflight.rules.generate")
            assert generated.returncode == 0, generated.stderr[-2000:]
        answers = sandbox.check(mutant)
    finally:
        path.write_text(original)
        for p, data in rules.items():
            p.write_bytes(data)
    assert answers and all(a == "failed" for a in answers), f"{mutant.key} ({mutant.hurts}) survived: {answers}"


def test_docs_testing_lists_every_mutant() -> None:
    doc = (ROOT / "docs" / "testing.md").read_text()
    missing = [m.key for m in MUTANTS if f"| `{m.key}` |" not in doc]
    assert not missing, f"docs/testing.md's mutation table lacks {missing}"
