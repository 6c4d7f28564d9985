"""What one engine costs a fleet's store: the agent's series per engine stay within bench/fleet.py's budget.

The page is the agent's own output on the demo's simulated vLLM and H100 after 305 simulated seconds (every
default window full), exactly what bench/fleet.py serves N copies of; one engine with one GPU. A change
that adds series per engine past SERIES_BUDGET fails here: raise the budget on purpose, and the cost per
1,000 GPUs in docs/deploy.md (section Fleet) with it.
"""

from __future__ import annotations

from bench.fleet import SERIES_BUDGET, engine_pages, families, per_gpu_series, series


async def test_one_engine_stays_within_its_series_budget() -> None:
    pages = await engine_pages()
    page = pages.agent[1]
    count = len(series(page))
    assert count <= SERIES_BUDGET, (
        f"one engine now exports {count} series (budget {SERIES_BUDGET}): every 1,000 GPUs cost "
        f"{1000 * (count - SERIES_BUDGET):,} more series in the fleet's store. Families: "
        f"{sorted(families(page).items(), key=lambda kv: -kv[1])[:12]}")
    # the page is a full one, so the budget cannot pass on a half-empty page
    for window in ("10s", "1m", "5m"):
        assert f'window="{window}"' in page, window
    assert count > 0.7 * SERIES_BUDGET
    assert 0 < per_gpu_series(page) < count // 4  # GPU series: one set for the engine's one GPU
    assert len(set(series(page))) == count  # no series twice
    assert len(series(pages.engine[1])) > 100  # vLLM's own page, scraped beside it
