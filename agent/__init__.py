"""The sidecar agent, in layers that import downwards only (tests/agent/test_layers.py holds them to it):

    cli        `rooflight` and its subcommands
    demo       the built-in simulated engine and GPU, and `rooflight demo`
    serve      the HTTP server and its web config (TLS, basic auth)
    proxy      `rooflight proxy`: the client's view (TTFT, ITL, goodput) from the bytes it relays
    sampling   configuration, sampler loops, source health, discovery
    metrics    names, catalog, the immutable Snapshot and its exposition
    signals    windows, derivations (MBU, MFU, rates, percentiles), detectors
    roofline   the physics: formulas, GPU profiles, model constants, the serving plan
    errors     ConfigError, the one exception a user sees (exit 2)
"""

__version__ = "0.2.0"  # pyproject reads it; deploy/ image tags and the chart follow it (tests/agent/test_version.py)
