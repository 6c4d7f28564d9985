"""Fixtures of the Dynamo checks: the Dynamo venv, the tiny tokenizer, one run per deployment.

.ci/dynamo.sh (called by .ci/real-engine.sh) sets ROOFLIGHT_DYNAMO_PYTHON to the cached venv's
python. Without it these tests fail, on purpose: a skipped Dynamo stage would look like a passing one.
Each deployment's processes are stopped by PID once its run is observed (the checks read the
observation only), and the parent conftest's `started` checks at session end that none is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from procs import ManagedProcess  # noqa: E402
from dynamo_runs import AGGREGATED, DISAGGREGATED, Deployment, DynamoRun, run_deployment  # noqa: E402


@pytest.fixture(scope="session")
def dynamo_python() -> str:
    python = os.environ.get("ROOFLIGHT_DYNAMO_PYTHON")
    if not python or not Path(python).exists():
        pytest.fail("ROOFLIGHT_DYNAMO_PYTHON is not set to the Dynamo venv's python: run .ci/dynamo.sh --test")
    return python


@pytest.fixture(scope="session")
def dynamo_model(dynamo_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama's tokenizer and config.json (no weights: the mocker reads these only)."""
    out = tmp_path_factory.mktemp("dynamo-model") / "tiny"
    maker = HERE.parent / "make_tiny_llama.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([dynamo_python, str(maker), str(out), "--no-weights"], check=True, env=env,
                   capture_output=True, timeout=300)
    return out


def _observe(dep: Deployment, python: str, model: Path, run_dir: Path, started: list[ManagedProcess]) -> DynamoRun:
    try:
        run = run_deployment(python, model, run_dir, dep, started)
    except BaseException:
        for proc in reversed(started):  # never leave a half-started deployment eating the 2 cores
            proc.stop()
        raise
    for proc in reversed(run.processes):
        proc.stop()
    print(f"\n[dynamo {dep.name}] timings {run.timings} load {run.load.summary()}")
    return run


@pytest.fixture(scope="session")
def agg_run(dynamo_python, dynamo_model, run_dir, started) -> DynamoRun:
    return _observe(AGGREGATED, dynamo_python, dynamo_model, run_dir, started)


@pytest.fixture(scope="session")
def disagg_run(dynamo_python, dynamo_model, run_dir, started) -> DynamoRun:
    return _observe(DISAGGREGATED, dynamo_python, dynamo_model, run_dir, started)
