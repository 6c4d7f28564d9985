"""Errors that carry what the user must fix."""

from __future__ import annotations


class ConfigError(Exception):
    """A bad flag, config file or model/GPU constant: the agent refuses to start (exit code 2)."""
