"""docs/engines.md's coverage table cannot drift: it is the one collectors/coverage.py renders, and
every adapter's declaration matches what its parser does on that engine's pages (a field declared
"none" is None on every page; a field declared with a source is set on at least one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rooflight.agent.metrics import names
from rooflight.collectors import coverage
from rooflight.collectors import engines
from support import ROOT, sample_text, synthetic_page

DOC = ROOT / "docs" / "engines.md"

# What no recorded or synthetic page shows: SGLang's opt-in length histograms, TGI's queue-time histogram.
SGLANG_LENGTHS = "".join(
    f'sglang:{name}_bucket{{model_name="m",le="+Inf"}} 2\nsglang:{name}_count{{model_name="m"}} 2\n'
    f'sglang:{name}_sum{{model_name="m"}} 300\n' for name in ("prompt_tokens_histogram", "generation_tokens_histogram")
)
TGI_QUEUE = ('tgi_request_queue_duration_bucket{le="+Inf"} 4\ntgi_request_queue_duration_count 4\n'
             "tgi_request_queue_duration_sum 1.5\n")

# What the CPU recordings cannot show: the failed-transfer counters of disaggregated prefill/decode.
VLLM_NIXL = 'vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 2.0\n'
SGLANG_TRANSFER = 'sglang:num_transfer_failed_reqs_total{model_name="m",tp_rank="0"} 1.0\n'

PAGES: dict[str, list[str]] = {
    "vllm": [*(sample_text(n) for n in ("vllm-cpu-rest-fresh.prom", "vllm-cpu-load-c16.prom",
                                        "vllm-cpu-preempt-during.prom")), VLLM_NIXL],
    "sglang": [
        sample_text("sglang-docs-llama31-8b-under-load.prom"),
        sample_text("dynamo-sglang-worker-1req.prom"),
        synthetic_page("sglang-dp2-tp2-pids"),
        SGLANG_LENGTHS,
        SGLANG_TRANSFER,
    ],
    "tgi": [synthetic_page("tgi-3x"), TGI_QUEUE],
    "trtllm": [synthetic_page("trtllm-serve-2026")],
    "triton": [sample_text("triton-trtllm-backend-ifb-readme.prom") + synthetic_page("triton-token-length-histograms")],
    "llamacpp": [sample_text("llamacpp-server-cpu-load-c8.prom")],
    "dynamo": [synthetic_page("dynamo-frontend")],  # the declared column is the frontend's
}


def _value(engine: str, page: str, field: str) -> list[object]:
    sample = engines.adapter(engine).parse(page, target="t", timestamp=0.0, duration=0.0)
    if field == "tensor_parallel_size":
        return [sample.info.tensor_parallel_size]
    return [getattr(s, field) for s in sample.series]


def test_every_engine_declares_every_field() -> None:
    assert set(coverage.ENGINES) == set(engines.names())
    for engine in coverage.ENGINES:
        assert set(coverage.coverage(engine)) == set(coverage.FIELDS), engine
    exported = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    assert set(coverage.FIELDS.values()) <= exported


@pytest.mark.parametrize("engine", sorted(PAGES))
def test_declarations_match_the_parser(engine: str) -> None:
    for field, cell in coverage.coverage(engine).items():
        values = [v for page in PAGES[engine] for v in _value(engine, page, field)]
        if coverage.is_missing(cell):
            assert all(v is None for v in values), f"{engine}.{field} is declared missing but parsed: {values}"
        else:
            assert any(v is not None for v in values), f"{engine}.{field} is declared from {cell} but never parsed"


def test_doc_holds_the_generated_table() -> None:
    doc = DOC.read_text()
    assert coverage.render_into(doc) == doc, "docs/engines.md is stale: run python -m rooflight.collectors.coverage --write"
    assert coverage.table() in doc


def test_check_mode_fails_on_a_stale_copy(tmp_path: Path) -> None:
    stale = tmp_path / "engines.md"
    stale.write_text(DOC.read_text().replace("`tgi_queue_size`", "`tgi_queue_length`"))
    cmd = [sys.executable, "-m", "rooflight.collectors.coverage", "--check", str(stale)]
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode == 1
    assert subprocess.run(cmd[:-1] + [str(DOC)], cwd=ROOT, capture_output=True).returncode == 0


def test_the_adding_an_engine_example_declares_every_field() -> None:
    """docs/engines.md's minimal adapter is copied by whoever adds an engine: its COVERAGE must be complete."""
    import re

    doc = (ROOT / "docs" / "engines.md").read_text()
    block = doc.split("COVERAGE: dict[str, str] = {", 1)[1].split("}", 1)[0]
    assert set(re.findall(r'^\s*"(\w+)":', block, re.M)) == set(coverage.FIELDS)


def test_an_incomplete_coverage_is_named_not_a_key_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = coverage.coverage
    monkeypatch.setattr(coverage, "coverage", lambda e: {k: v for k, v in real(e).items() if k != "queue_time"}
                        if e == "tgi" else real(e))
    with pytest.raises(ValueError, match="collectors/tgi: COVERAGE lacks queue_time"):
        coverage.table()
