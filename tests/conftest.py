"""Shared fixtures (helpers live in support.py, importable from any test folder), the CI rule that a
test needing an outside tool fails when the tool is missing instead of skipping quietly, and the backstop
that stops a run whose test outlives its own timeout, and the cycle collector's settings put back after a
test that ran a command in this process (`rooflight run` and `demo` tune it: agent/sampling/gc_tuning.py)."""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import threading
import time
from typing import AsyncIterator, Iterator

import pytest

from support import FakeEngine, sample_text

# The Go programs the tests start (promtool, Prometheus, Alertmanager, VictoriaMetrics) collect garbage at 4x
# their live heap, not 2x: promtool's unit tests of the rules take about a fifth less CPU (slo, availability,
# health and goodput files: 54.7 -> 43.6 s user, measured twice here), at about 120 MB where they took 70.
os.environ.setdefault("GOGC", "400")

# Marks of tests that need a binary .ci/install provides (see pyproject's markers). Outside CI such a
# test skips when its tool is missing; with CI=true (GitHub Actions, GitLab, most CI systems) it fails.
TOOL_MARKS = ("prometheus", "node", "victoriametrics")


def in_ci() -> bool:
    """True under CI (CI=true or 1), where every tool .ci/install provides must be there."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped report gives (pytest keeps it as (file, line, 'Skipped: reason'))."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.fixture(autouse=True)
def _collector_settings_kept() -> Iterator[None]:
    """A test that calls `rooflight run` or `demo` in this process (a config error, say) tunes the collector
    for the whole worker: frozen objects and the young threshold would carry into every later test."""
    thresholds = gc.get_threshold()
    yield
    if gc.get_freeze_count():
        gc.unfreeze()
    if gc.get_threshold() != thresholds:
        gc.set_threshold(*thresholds)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    marks = [m for m in TOOL_MARKS if item.get_closest_marker(m) is not None]
    if marks:
        report.outcome = "failed"
        report.longrepr = (f"CI=true and this test needs {', '.join(marks)}: a missing tool is a failure in CI, "
                           f"not a skip (.ci/install installs it). {skip_reason(report)}")


# -- the backstop -----------------------------------------------------------------------------------------
# pytest-timeout (signal method, pyproject) fails a test that runs past `timeout` and the run goes on. Its
# timer fires once, so a teardown that hangs after that failure, or a main thread stuck where no signal
# reaches Python, would stall the run for good. Past faulthandler_timeout (faulthandler has printed every
# thread's traceback by then) plus BACKSTOP_AFTER_S, the watchdog sends this process SIGINT: pytest stops
# and prints its summary (what passed, what failed). If even that does not end it, the process exits.
BACKSTOP_AFTER_S = 60.0
BACKSTOP_EXIT_S = 60.0  # after the SIGINT, if the run has not ended


class Backstop:
    """A daemon thread that watches how long the current test has run (one per process: per xdist worker)."""

    def __init__(self, limit: float, stderr_fd: int) -> None:
        self.limit, self.fd = limit, stderr_fd
        self.nodeid: str | None = None
        self.started = 0.0
        threading.Thread(target=self._watch, name="rooflight-test-backstop", daemon=True).start()

    def say(self, text: str) -> None:
        os.write(self.fd, f"\n*** backstop: {text}\n".encode())

    def _watch(self) -> None:
        interrupted_at: float | None = None
        while True:
            time.sleep(1.0)
            nodeid, started = self.nodeid, self.started
            now = time.monotonic()
            if interrupted_at is not None:
                if now - interrupted_at > BACKSTOP_EXIT_S:
                    self.say(f"the run did not stop within {BACKSTOP_EXIT_S:.0f} s of SIGINT: exiting")
                    os._exit(3)
            elif nodeid is not None and now - started > self.limit:
                self.say(f"{nodeid} has run {now - started:.0f} s, past its timeout and the {self.limit:.0f} s "
                         "backstop: every thread's traceback, then SIGINT (pytest stops and prints its summary)")
                faulthandler.dump_traceback(file=self.fd, all_threads=True)
                interrupted_at = now
                os.kill(os.getpid(), signal.SIGINT)


BACKSTOP_KEY = pytest.StashKey[Backstop]()


def pytest_configure(config: pytest.Config) -> None:
    limit = float(config.getini("faulthandler_timeout") or 0)
    if limit > 0:  # a copy of stderr taken now, before a test's output capture replaces fd 2
        config.stash[BACKSTOP_KEY] = Backstop(limit + BACKSTOP_AFTER_S, os.dup(2))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    backstop = item.config.stash.get(BACKSTOP_KEY, None)
    if backstop is not None:
        backstop.started, backstop.nodeid = time.monotonic(), item.nodeid
    yield
    if backstop is not None:
        backstop.nodeid = None


@pytest.fixture
async def fake_engine() -> AsyncIterator[FakeEngine]:
    engine = FakeEngine(body=sample_text("vllm-cpu-load-c16.prom"))
    await engine.start()
    yield engine
    await engine.stop()


# The tests that take a minute or more, or hold one worker for long (a group run one after another), in the
# order they start: pytest-xdist hands tests out in collection order as workers free up, so the long ones
# started first overlap the many short ones instead of leaving one worker alone at the end (the fast suite's
# slowest tests: docs/testing.md, "How long the suite takes").
LONG_FIRST = (
    "tests/mutations/test_mutants.py",
    "tests/e2e/test_replicas_e2e.py",
    "tests/e2e/test_alerts_e2e.py",
    "tests/rules/test_rules.py::test_promtool_unit_tests_pass",
    "tests/dashboards/test_dashboards_e2e.py",
    "tests/e2e/test_status_page_browser.py",
    "tests/agent/test_detector_registry.py",
    "tests/e2e/test_soak.py",
    "tests/rules/test_incident_series.py",
    "tests/agent/signals/test_windows_budget.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: the rest keep their order
