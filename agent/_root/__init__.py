"""Rooflight: the sidecar that puts LLM serving on the roofline (MBU for decode, MFU for prefill).

The one installed top-level package. Its parts keep the repository's top-level folders:
`rooflight.agent` (agent/), `rooflight.collectors` (collectors/), `rooflight.rules` (rules/) and
`rooflight.dashboards` (dashboards/); pyproject.toml maps each with setuptools' package-dir.
"""

from rooflight.agent import __version__

__all__ = ["__version__"]
