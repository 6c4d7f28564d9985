"""What one setting is: the type of every declaration in agent/config/settings.py (and its plan and rules
parts), and the commands that offer them."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

RUN, PROXY, DEMO, PLAN, RULES = "run", "proxy", "demo", "plan", "rules"
COMMANDS = (RUN, PROXY, DEMO, PLAN, RULES)
SECTIONED = (RUN, PLAN)  # commands whose --help groups flags in sections (the others have one)
ENV_PREFIX = "ROOFLIGHT_"


@dataclass(frozen=True)
class Setting:
    """One setting: what the user writes (flag, ROOFLIGHT_<KEY>, file key), its default and its check.

    `parse` checks a value as written, naming it in its message as the user spelt it: `rooflight run`'s
    key (from any of its three layers), or the proxy's flag. The SLO spellings and the bucket edges are
    checked by agent/proxy/config.py (the proxy's SLO grammar and histogram names live with the proxy);
    the demo's flags by agent/demo/config.py and argparse; plan's and rules' by argparse and the command.

    A setting two commands share (the model, GPU and TP of `run` and `plan`, the proxy's SLOs of `run` and
    `proxy`) is one Setting; where its help, metavar, type or default reads otherwise in one of them, `per`
    says so for that command (for_command)."""

    key: str
    help: str = ""
    commands: tuple[str, ...] = (RUN,)
    flags: Mapping[str, str] = field(default_factory=dict)  # a command whose flag is not --key-with-dashes
    short: str | None = None  # a one-letter twin of the flag (`-o`)
    metavar: str | None = None
    group: str | None = None  # its --help section in a sectioned command
    exclusive: str | None = None  # flags of one exclusive group: at most one of them is given
    action: str | None = None  # argparse's: append (repeatable), store_true, store_false
    type: Callable[[str], Any] | None = None  # argparse's int or float: a bad value is argparse's exit 2
    choices: tuple[str, ...] | None = None
    flag_default: Any = None  # what argparse stores when the flag is absent
    env: bool = True  # `rooflight run` reads ROOFLIGHT_<KEY>
    file: bool = True  # a key of `rooflight run`'s config file
    target: bool = False  # one engine target's: a key of a `targets:` entry too
    proxy: bool = False  # the in-process proxy's: needs proxy_listen
    parse: Callable[[Any, str], Any] | None = None  # value as written, its name -> checked value
    default: Any = None  # the value when no flag, environment variable or file sets it
    hint: str | None = None  # the file's spelling, where the flag's name (dashes as underscores) is not it
    flagged: bool = True  # False: a config file and environment setting only
    per: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # command -> fields that read otherwise there
    after: str | None = None  # (in `per`) the flag it follows in that command's --help ("" = first), not its place here

    def flag(self, command: str) -> str:
        return self.flags.get(command, "--" + self.key.replace("_", "-"))

    def for_command(self, command: str) -> Setting:
        """The setting as `command` offers it (its `per` fields applied)."""
        changes = self.per.get(command)
        return replace(self, **changes) if changes else self

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + self.key.upper()


def text(value: Any, what: str) -> str:
    return str(value)
