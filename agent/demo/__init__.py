"""`rooflight demo`: a simulated vLLM engine serving Llama-3-8B on an H100 SXM, plus a simulated GPU.

The engine (engine.py) is a deterministic step simulator whose step times come from the same physics
the agent uses (plant.py -> rooflight.agent.roofline.physics); exposition.py renders it in vLLM's exact /metrics format;
server.py advances it in real time and serves it over HTTP; gpu.py keeps a fake NVML in step with it.
The agent scrapes it exactly as it would scrape vLLM. Scenarios are in scenarios.py.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.demo.config import DemoConfig
from rooflight.agent.demo.scenarios import SCENARIOS

__all__ = ["SCENARIOS", "EVENTS", "DemoConfig", "DemoEngine", "start_demo_engine"]
_SERVED = ("EVENTS", "DemoEngine", "start_demo_engine")


def __getattr__(name: str) -> Any:
    """The server's names, imported when first asked for: every `rooflight` command registers the demo's
    flags, and only `rooflight demo` needs aiohttp (a third of a command's start)."""
    if name in _SERVED:
        from rooflight.agent.demo import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
