"""Every metric name collectors/dynamo.py reads exists on the real Dynamo pages of this run (a renamed
family fails here), except the names of Dynamo before 1.6 that it still reads for older workers
(LEGACY, each on a recorded page of that time)."""

from __future__ import annotations

import pytest

from rooflight.collectors import dynamo
from scrape import Samples

pytestmark = pytest.mark.real_engine

# Read for older workers only: Dynamo 1.6.1's workers (the mocker included) export no kvstats_* families;
# tests/collectors/test_dynamo_recorded.py finds them on the January 2026 TRT-LLM worker page.
LEGACY = frozenset({dynamo.KV_USAGE, dynamo.KV_TOTAL_BLOCKS, dynamo.PREFIX_HIT_RATE})


def _names(pages: list[Samples]) -> set[str]:
    return {n for page in pages for (n, _) in page}


def test_every_name_the_adapter_reads_is_on_the_real_pages(agg_run, disagg_run):
    pages = [*agg_run.after.values(), *disagg_run.after.values()]
    missing = sorted(dynamo.NAMES - LEGACY - _names(pages))
    assert not missing, f"collectors/dynamo.py reads names Dynamo no longer exports: {missing}"
    assert not LEGACY & _names(pages), "a legacy name is back: move it out of LEGACY"
