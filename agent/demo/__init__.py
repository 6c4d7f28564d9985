"""`rooflight demo`: a simulated vLLM engine serving Llama-3-8B on an H100 SXM, plus a simulated GPU.

The engine (engine.py) is a deterministic step simulator whose step times come from the same physics
the agent uses (plant.py -> rooflight.agent.roofline.physics); exposition.py renders it in vLLM's exact /metrics format;
server.py advances it in real time and serves it over HTTP; gpu.py keeps a fake NVML in step with it.
The agent scrapes it exactly as it would scrape vLLM. Scenarios are in scenarios.py.
"""

from __future__ import annotations

from rooflight.agent.demo.config import DemoConfig
from rooflight.agent.demo.scenarios import SCENARIOS
from rooflight.agent.demo.server import EVENTS, DemoEngine, start_demo_engine

__all__ = ["SCENARIOS", "EVENTS", "DemoConfig", "DemoEngine", "start_demo_engine"]
