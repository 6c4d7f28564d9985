"""The suite's own guards: a golden test never writes what it compares with, and in CI (CI=true) a
check whose tool is missing fails instead of skipping. Each guard is run here, not read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import GOLDEN, GOLDEN_OUT_ENV, ROOT, TESTS, check_golden

ANY_GOLDEN = GOLDEN / "vllm-engine-down.prom"


# -- goldens -----------------------------------------------------------------------------------------
def test_a_golden_is_compared_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = ANY_GOLDEN.read_text()
    monkeypatch.setenv(GOLDEN_OUT_ENV, str(tmp_path))  # what tests/regen_goldens.py sets
    with pytest.raises(AssertionError, match="differs"):
        check_golden(ANY_GOLDEN, before + "rooflight_made_up 1.0\n")
    assert ANY_GOLDEN.read_text() == before
    assert (tmp_path / ANY_GOLDEN.name).read_text() == before + "rooflight_made_up 1.0\n"
    check_golden(ANY_GOLDEN, before)  # and the same text passes


def test_the_old_update_switch_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    before = ANY_GOLDEN.read_text()
    monkeypatch.setenv("ROOFLIGHT_UPDATE_GOLDEN", "1")
    with pytest.raises(AssertionError, match="regen_goldens"):
        check_golden(ANY_GOLDEN, "something else\n")
    assert ANY_GOLDEN.read_text() == before


def test_regen_goldens_finds_every_golden_test() -> None:
    sys.path.insert(0, str(TESTS))
    try:
        import regen_goldens
    finally:
        sys.path.remove(str(TESTS))
    found = {p.relative_to(TESTS).as_posix() for p in regen_goldens.golden_tests()}
    assert {"e2e/test_engines_golden.py", "agent/metrics/test_exposition_golden.py"} <= found


# -- a missing tool in CI ----------------------------------------------------------------------------
PROBE = '''
import pytest

@pytest.mark.prometheus
@pytest.mark.skipif(True, reason="Debian's prometheus is not installed")
def test_needs_prometheus():
    pass

@pytest.mark.skipif(True, reason="not a tool")
def test_skips_for_another_reason():
    pass
'''


def _run_probe(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    prometheus: needs prometheus\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(TESTS)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:timeout",
                           "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)


def test_under_ci_a_missing_tool_fails(tmp_path: Path) -> None:
    result = _run_probe(tmp_path, "true")
    assert result.returncode == 1, result.stdout
    assert "a missing tool is a failure in CI" in result.stdout
    assert "1 skipped" in result.stdout  # a skip for another reason stays a skip


def test_outside_ci_a_missing_tool_skips(tmp_path: Path) -> None:
    result = _run_probe(tmp_path, None)
    assert result.returncode == 0, result.stdout
    assert "2 skipped" in result.stdout


# -- .ci/install and deploy/validate.sh ------------------------------------------------------------------
def _script_part(path: Path, start: str, end: str) -> str:
    """The lines of a shell script from the one starting with `start` up to (not including) `end`."""
    text = path.read_text()
    i = text.index(start)
    return text[i:text.index(end, i)]


def _stub_bin(tmp_path: Path, *names: str) -> Path:
    """A PATH folder holding only these commands (each exits 0)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name in names:
        stub = folder / name
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    return folder


FLEET = ("victoria-metrics", "vmalert", "vmagent", "prometheus-alertmanager")  # the fleet stage's


@pytest.mark.parametrize(
    ("present", "installs"),
    [
        (("promtool", "prometheus", "systemd-analyze", "amtool", *FLEET), []),
        # promtool alone is not enough: e2e needs the server
        (("promtool", "systemd-analyze", "amtool", *FLEET), ["prometheus"]),
        (("prometheus", "systemd-analyze", "amtool", *FLEET), ["prometheus"]),
        # systemd-analyze: deploy/validate.sh verifies the unit
        (("promtool", "prometheus", "amtool", *FLEET), ["systemd"]),
        (("promtool", "prometheus", "systemd-analyze", "amtool", "victoria-metrics", "vmagent", "prometheus-alertmanager"),
         ["victoria-metrics"]),  # vmalert comes with it: the package holds all three
        (("promtool", "prometheus", "systemd-analyze", "amtool", "victoria-metrics", "vmalert", "vmagent"),
         ["prometheus-alertmanager"]),
        # amtool alone is not enough: the notifications stage runs the Alertmanager itself; and amtool comes
        # with it
        (("promtool", "prometheus", "systemd-analyze", "victoria-metrics", "vmalert", "vmagent", "prometheus-alertmanager"),
         ["prometheus-alertmanager"]),
    ],
)
def test_ci_install_installs_what_is_missing(tmp_path: Path, present: tuple[str, ...], installs: list[str]) -> None:
    part = _script_part(ROOT / ".ci/install", "need_apt=()", "command -v npm")
    bin_dir = _stub_bin(tmp_path, *present)
    result = subprocess.run(["/bin/bash", "-c", part + 'echo "${need_apt[@]}"'], capture_output=True, text=True,
                            env={"PATH": str(bin_dir)}, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == installs


@pytest.mark.parametrize(("ci", "rc"), [("true", 1), (None, 0)])
def test_validate_sh_without_systemd_analyze_fails_only_in_ci(tmp_path: Path, ci: str | None, rc: int) -> None:
    part = _script_part(ROOT / "deploy/validate.sh", "if command -v systemd-analyze", 'say "all deploy checks passed"')
    env = {"PATH": str(_stub_bin(tmp_path)), **({"CI": ci} if ci else {})}
    result = subprocess.run(["/bin/bash", "-c", 'say() { echo "[deploy] $*"; }\nset -e\n' + part],
                            capture_output=True, text=True, env=env, timeout=30)
    assert result.returncode == rc, result.stdout + result.stderr
    assert ("FAIL systemd-analyze not installed" in result.stderr) == (rc == 1)
    assert ("NOT verified" in result.stdout) == (rc == 0)


# -- the fast suite's workers --------------------------------------------------------------------------------
def test_loadgroup_runs_a_group_on_one_worker(tmp_path: Path) -> None:
    # .ci/test's `-n 4 --dist loadgroup` keeps a group's tests (one Chromium, one wheel build, the mutants' one
    # sandbox) on one worker; pytest 9.2 under pytest-xdist 3.8 silently drops the grouping (pytest-xdist#1386)
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\npytestmark = pytest.mark.xdist_group('one')\n"
        + "".join(f"def test_{i}():\n    print('WORKER', os.environ['PYTEST_XDIST_WORKER'])\n" for i in range(6)))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                          "-rA", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    workers = {line.split()[1] for line in run.stdout.splitlines() if line.startswith("WORKER ")}
    assert len(workers) == 1, (f"a group's tests ran on {sorted(workers)}: --dist loadgroup does not group with "
                               "this pytest (install the test extra's, pyproject.toml)")
