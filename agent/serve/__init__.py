"""The HTTP side: the aiohttp app (/metrics, /api/v1/snapshot, /) and the web config (TLS, basic auth)."""
