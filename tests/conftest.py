"""Shared fixtures (helpers live in support.py, importable from any test folder), and the CI rule that a
test needing an outside tool fails when the tool is missing instead of skipping quietly."""

from __future__ import annotations

import os
from typing import AsyncIterator, Iterator

import pytest

from support import FakeEngine, sample_text

# Marks of tests that need a binary .ci/install provides (see pyproject's markers). Outside CI such a
# test skips when its tool is missing; with CI=true (GitHub Actions, GitLab, most CI systems) it fails.
TOOL_MARKS = ("prometheus", "node")


def in_ci() -> bool:
    """True under CI (CI=true or 1), where every tool .ci/install provides must be there."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped report gives (pytest keeps it as (file, line, 'Skipped: reason'))."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


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


@pytest.fixture
async def fake_engine() -> AsyncIterator[FakeEngine]:
    engine = FakeEngine(body=sample_text("vllm-cpu-load-c16.prom"))
    await engine.start()
    yield engine
    await engine.stop()
