"""Rooflight: the sidecar that puts LLM serving on the roofline (MBU for decode, MFU for prefill)."""

__version__ = "0.1.0"
