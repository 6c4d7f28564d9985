"""The one validated reader every config.json value goes through.

A config.json is input from outside: a field can hold a 400-digit integer, a string where a count is
expected, a scalar where a list is expected, `0` where a size must be positive, or `1e30`. Each
getter here checks type and range and raises ConfigError naming the field, the value and what to
write instead, so `rooflight plan` and `rooflight run` exit 2 with that message, never a traceback.
Bounds are generous (no published model comes near them) but finite, so every product of fields
stays a finite float and every loop over layers stays short.
"""

from __future__ import annotations

from typing import Any, Mapping

from rooflight.agent.errors import ConfigError

MAX_COUNT = 1_000_000_000  # the default upper bound of a size or count field
MAX_LIST = 100_000  # entries in any list field


def describe(value: Any) -> str:
    """A short rendering of a bad value: a 400-digit integer is named, not printed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) >= 10**15:
        return f"a {len(str(abs(value)))}-digit integer"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


class ConfigReader:
    """Typed, bounded access to one JSON object (a config.json or an object nested in one)."""

    def __init__(self, cfg: Any, where: str, path: str = "") -> None:
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{where}: {path.rstrip('.') or 'the config'} must be a JSON object, "
                              f"got {_type_name(cfg)}")
        self.cfg = cfg
        self.where = where
        self.path = path

    def _fail(self, key: str, value: Any, want: str) -> ConfigError:
        return ConfigError(f"{self.where}: {self.path}{key} must be {want}, got {describe(value)}")

    def has(self, key: str) -> bool:
        """The key is present and not null."""
        return self.cfg.get(key) is not None

    def first_key(self, *keys: str) -> str | None:
        """The first of `keys` that is present and not null."""
        return next((k for k in keys if self.has(k)), None)

    def integer(self, *keys: str, default: int | None = None, lo: int = 0, hi: int = MAX_COUNT) -> int:
        """The first present key among `keys`: a whole JSON number in lo..hi; `default` when none is
        present; ConfigError naming the keys when none is present and there is no default."""
        key = self.first_key(*keys)
        if key is None:
            if default is None:
                raise ConfigError(f"{self.where}: missing {' / '.join(self.path + k for k in keys)}")
            return default
        value = self.cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self._fail(key, value, f"a whole number from {lo:,} to {hi:,}")
        return value

    def optional_integer(self, key: str, *, lo: int = 0, hi: int = MAX_COUNT) -> int | None:
        """A whole number in lo..hi, or None when the key is absent or null."""
        return self.integer(key, lo=lo, hi=hi) if self.has(key) else None

    def boolean(self, key: str, default: bool) -> bool:
        """JSON true or false; `default` when absent or null."""
        if not self.has(key):
            return default
        value = self.cfg[key]
        if not isinstance(value, bool):
            raise self._fail(key, value, "true or false")
        return value

    def string(self, key: str, default: str | None = None) -> str | None:
        """A JSON string (at most 1,000 characters); `default` when absent or null."""
        if not self.has(key):
            return default
        value = self.cfg[key]
        if not isinstance(value, str) or len(value) > 1000:
            raise self._fail(key, value, "a string of at most 1,000 characters")
        return value

    def mapping(self, key: str) -> ConfigReader | None:
        """A nested JSON object as its own reader, or None when absent or null."""
        if not self.has(key):
            return None
        value = self.cfg[key]
        if not isinstance(value, Mapping):
            raise self._fail(key, value, "a JSON object")
        return ConfigReader(value, self.where, f"{self.path}{key}.")

    def _list(self, key: str) -> list[Any]:
        value = self.cfg[key]
        if not isinstance(value, list) or len(value) > MAX_LIST:
            raise self._fail(key, value, f"a list of at most {MAX_LIST:,} entries")
        return value

    def int_list(self, key: str, *, lo: int = 0, hi: int = MAX_COUNT) -> tuple[int, ...]:
        """A list of whole numbers in lo..hi; () when absent or null."""
        if not self.has(key):
            return ()
        out = []
        for i, value in enumerate(self._list(key)):
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise self._fail(f"{key}[{i}]", value, f"a whole number from {lo:,} to {hi:,}")
            out.append(value)
        return tuple(out)

    def str_list(self, key: str) -> tuple[str, ...]:
        """A list of strings (at most 1,000 characters each); () when absent or null."""
        if not self.has(key):
            return ()
        out = []
        for i, value in enumerate(self._list(key)):
            if not isinstance(value, str) or len(value) > 1000:
                raise self._fail(f"{key}[{i}]", value, "a string of at most 1,000 characters")
            out.append(value)
        return tuple(out)

    def mapping_items(self, key: str) -> tuple[tuple[str, ConfigReader], ...]:
        """The entries of a JSON object whose values are objects, each as a reader."""
        inner = self.mapping(key)
        if inner is None:
            return ()
        return tuple((name, ConfigReader(value, self.where, f"{inner.path}{name}."))
                     for name, value in inner.cfg.items()
                     if _object_or_fail(inner, name, value))


def _object_or_fail(reader: ConfigReader, name: str, value: Any) -> bool:
    if not isinstance(value, Mapping):
        raise reader._fail(name, value, "a JSON object")
    return True
