"""`rooflight proxy`: what the client feels, measured in front of an OpenAI-compatible server.

A reverse proxy that passes every byte through unchanged and, beside the traffic, times each request:
TTFT, every inter-token gap, TPOT, end-to-end time, tokens, finish reason and status; it exports them as
`rooflight_client_*` with goodput under joint SLOs (docs/proxy.md, docs/metrics.md).

Modules, lowest first: `sse` (a pure incremental SSE and OpenAI chunk parser), `tracker` (one request's
timings, pure), `slo` and `tenants` (pure), `quantiles` (exact and sketched windowed percentiles),
`stats` (accumulates finished requests into an immutable `ClientSnapshot`), `catalog` and `exposition`
(the metrics), `config`, `server` (aiohttp) and `cli` (the `proxy` subcommand).
"""
