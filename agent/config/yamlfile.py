"""Small YAML files (the agent's config file, the web config) read within bounds, with errors that say what to fix."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from rooflight.agent.errors import ConfigError

# YAML files (this config and the web config) are small; these bound what a hostile or broken file costs
MAX_CONFIG_BYTES = 1024 * 1024
MAX_YAML_ALIASES = 32  # `*name` references; a real config needs a handful at most
MAX_YAML_NODES = 20_000  # scalars, lists and mappings as written
MAX_YAML_EXPANDED = 100_000  # the same counted with every alias expanded (a "billion laughs" stops here)
MAX_YAML_EXPANDED_CHARS = 4 * 1024 * 1024  # text in all strings, aliases expanded


def read_yaml(path: str | os.PathLike[str], what: str) -> Any:
    """Load a small YAML file (a config or web config) or raise ConfigError naming what to fix.

    Bounded: at most MAX_CONFIG_BYTES of UTF-8, MAX_YAML_ALIASES aliases, MAX_YAML_NODES nodes, and
    MAX_YAML_EXPANDED nodes or MAX_YAML_EXPANDED_CHARS of text once aliases are expanded (an alias bomb
    is cheap to load and explodes only when the values are used). A syntax error reports its line,
    column and kind only: never the offending line, which may be a password or a bcrypt hash."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{what} {p}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {p}: is a directory; give the path of a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"{what} {p}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} {p}: larger than {MAX_CONFIG_BYTES // 1024} KiB; a config is a few lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {p}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        data = _BoundedLoader.load(text)
    except (_TooBig, _Refused) as exc:
        raise ConfigError(f"{what} {p}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {p}: not valid YAML {yaml_error_summary(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{what} {p}: nested too deeply to be a config") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a value YAML parses but Python refuses: 2001-02-30
        raise ConfigError(f"{what} {p}: a value YAML cannot turn into data ({type(exc).__name__}); quote it"
                          " if it is meant as text") from None
    _check_expanded_size(data, f"{what} {p}")
    return data


class _TooBig(Exception):
    pass


class _Refused(Exception):
    pass


MERGE = "tag:yaml.org,2002:merge"
# YAML 1.1 reads 1_0 as 10, 010 as 8 and 1:30 as 90; no config means that by them
_SURPRISING_NUMBER = re.compile(r"_|:|^[-+]?0[0-9]")


def _plainly_written(node: yaml.ScalarNode, value: Any) -> Any:
    """`value`, YAML's reading of `node`, unless it was written in a way YAML 1.1 reads surprisingly."""
    if _SURPRISING_NUMBER.search(node.value):
        raise _Refused(f"line {node.start_mark.line + 1}: the number {node.value!r} is read by YAML as {value}; "
                       "write it plainly (e.g. 10, 0.5)")
    return value


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that counts nodes and aliases while composing, and stops past the budgets."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise _TooBig(f"more than {MAX_YAML_ALIASES} YAML aliases (*name); write the values out")
        else:
            self._nodes += 1
            if self._nodes > MAX_YAML_NODES:
                raise _TooBig(f"more than {MAX_YAML_NODES} YAML values; a config is a few lines")
        return super().compose_node(parent, index)

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
        """PyYAML keeps the last of a key given twice without a word; a config that says two things is refused,
        naming the key and both lines (never a value). Checked as each mapping is composed, before a `<<` merge
        rewrites it: keys a merge brings in may be overridden, two `<<` in one mapping may not."""
        node = super().compose_mapping_node(anchor)
        first: dict[Any, tuple[str, int]] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # a list or mapping as a key: refused later as no setting name
            key = MERGE if key_node.tag == MERGE else self.construct_object(key_node)  # on, yes, true: one key
            line = key_node.start_mark.line + 1
            if key in first:
                written, at = first[key]
                as_written = "" if written == key_node.value else f", as {written!r}"
                if key == MERGE:
                    raise _Refused(f"line {line}: `<<` is given twice (first at line {at}); YAML would merge only the "
                                   "last: merge several with `<<: [*a, *b]`")
                raise _Refused(f"line {line}: the key {key_node.value!r} is given twice (first at line {at}"
                               f"{as_written}); YAML would keep only the last, so remove one")
            first[key] = (key_node.value, line)
        return node

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        return _plainly_written(node, super().construct_yaml_int(node))

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        return _plainly_written(node, super().construct_yaml_float(node))

    @classmethod
    def load(cls, text: str) -> Any:
        loader = cls(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
_BoundedLoader.add_constructor("tag:yaml.org,2002:float", _BoundedLoader.construct_yaml_float)


def _check_expanded_size(data: Any, where: str) -> None:
    """Walk the loaded data counting aliased parts every time they appear; stop past the budget."""
    stack, seen, chars = [data], 0, 0
    while stack:
        item = stack.pop()
        seen += 1
        chars += len(item) if isinstance(item, (str, bytes)) else 0
        if seen > MAX_YAML_EXPANDED or chars > MAX_YAML_EXPANDED_CHARS:
            raise ConfigError(f"{where}: its YAML aliases expand to more than {MAX_YAML_EXPANDED} values or"
                              f" {MAX_YAML_EXPANDED_CHARS // (1024 * 1024)} MiB of text; write the values out"
                              " instead of nesting aliases")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_TOKEN_NAME = re.compile(r"^'<[a-z ]+>'$")


def yaml_error_summary(exc: yaml.YAMLError) -> str:
    """'at line L, column C: <kind>' of a YAML error, without the text of the file.

    PyYAML's own message quotes the offending line (it may be a password); its `problem` can quote a
    piece of it too, so every quoted fragment is dropped except PyYAML's token names like '<scalar>'."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    kind = getattr(exc, "problem", None) or getattr(exc, "reason", None) or type(exc).__name__
    kind = _QUOTED.sub(lambda m: m.group(0) if _TOKEN_NAME.match(m.group(0)) else "(...)", str(kind))
    if mark is not None:
        return f"at line {mark.line + 1}, column {mark.column + 1}: {kind}"
    position = getattr(exc, "position", None)
    return f"at character {position}: {kind}" if position is not None else f"({kind})"

