"""Shared fixtures (helpers live in support.py, importable from any test folder)."""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from support import FakeEngine, sample_text


@pytest.fixture
async def fake_engine() -> AsyncIterator[FakeEngine]:
    engine = FakeEngine(body=sample_text("vllm-cpu-load-c16.prom"))
    await engine.start()
    yield engine
    await engine.stop()
