"""Python's cycle collector, set for a process that samples for months.

Almost nothing the agent makes is a reference cycle: pages, samples and snapshots are freed by their
reference counts, and the collector finds nothing (measured, `bench/agent_steps.py --targets 64 --hz 1`
with a gc callback: 68 objects collected in 30 s, all by full collections). What it costs is its walks:
with the defaults (a young collection every 700 net allocations) a page's parse, which holds a few
thousand objects for a moment, set off young collections mid-parse 11 times a second, and every
object alive at start (modules, classes, functions: 40,000-50,000) was walked again by each full
collection. Measured at 64 targets x 1 Hz, 30 s after a 160 s warm-up: the collector took 14% of the
agent's CPU (full collections of 117 ms every ~10 s, young and middle ones 4.5%); with the history's
histograms packed where it does not look (signals/windows.py, Point) 7.4%; with this too 0.6-1.1%
(a young collection every 10-14 s, no full one in 30 s; `bench/agent_steps.py` prints it).
"""

from __future__ import annotations

import gc

# A young collection after this many net allocations of container objects: more than a page's parse
# holds at once (a 55 kB vLLM page: a few thousand), so the objects of one sample are freed by their
# reference counts before the collector ever walks them.
YOUNG_THRESHOLD = 10_000


def tune_for_sampling() -> None:
    """Freeze what start-up made and collect the young generation less often (see the module docstring).

    Called once by the commands that run for long (`rooflight run`, `rooflight demo`) after start-up,
    never by `serve()`, which tests call many times in one process. A Python whose threshold is already
    higher keeps it, and one whose automatic collection is off (a threshold of 0) keeps it off."""
    gc.collect()  # start-up's cycles (import machinery, argparse) go now, not frozen with the rest
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young:
        gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)
