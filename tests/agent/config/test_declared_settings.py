"""Each flag, environment variable and config file key is declared once, in agent/config/settings.py.

The parsers of every command (`run`, `proxy`, `demo`, `plan`, `rules`) are compared with the declarations,
and the command modules are read with `ast`: a flag added by hand anywhere else, or declared twice, fails here.
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter

import pytest

from rooflight.agent import cli
from rooflight.agent.config import settings as st
from support import ROOT

COMMAND_MODULES = ("agent/cli.py", "agent/proxy/cli.py", "agent/demo/cli.py", "agent/plan_cli.py", "rules/generate.py")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sub.choices[name] for name in st.COMMANDS}


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [flag for action in parser._actions for flag in action.option_strings if flag not in ("-h", "--help")]


def _mismatch(parser: argparse.ArgumentParser, command: str) -> list[str]:
    """What the parser offers that no declaration says, twice, or not at all."""
    declared = Counter(flag for s in st.offered(command) for flag in (s.flag(command), *((s.short,) if s.short else ())))
    offered = Counter(_flags(parser))
    wrong = [f"{flag} declared {n} times" for flag, n in declared.items() if n > 1]
    wrong += [f"{flag} on the parser {n} times" for flag, n in offered.items() if n > 1]
    wrong += [f"{flag} not declared in settings.py" for flag in offered.keys() - declared.keys()]
    wrong += [f"{flag} declared but not on the parser" for flag in declared.keys() - offered.keys()]
    return sorted(wrong)


@pytest.mark.parametrize("command", st.COMMANDS)
def test_every_flag_of_a_command_is_one_declaration(command: str) -> None:
    assert _mismatch(_subparsers()[command], command) == []


def test_the_check_sees_a_flag_added_by_hand() -> None:
    parser = _subparsers()["proxy"]
    parser.add_argument("--fanout", metavar="N")  # a flag declared on the parser only
    assert _mismatch(parser, "proxy") == ["--fanout not declared in settings.py"]


# Flags of a module's own tool, not of a `rooflight` command: `python -m rooflight.rules.generate --check`.
TOOLS = {"rules/generate.py": {"--check"}}


def test_the_command_modules_declare_no_flag_themselves() -> None:
    """Only the top-level --version is added outside settings.py (it is the program's, no command's)."""
    found = []
    for rel in COMMAND_MODULES:
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
                found += [f"{rel}: {f}" for f in flags if f != "--version" and f not in TOOLS.get(rel, ())]
    assert found == []


def test_each_setting_and_its_environment_variable_and_file_key_is_declared_once() -> None:
    run = [s for s in st.SETTINGS if st.RUN in s.commands]
    assert [k for k, n in Counter(s.key for s in run).items() if n > 1] == []
    for command in st.COMMANDS:
        keys = Counter(s.key for s in st.SETTINGS if command in s.commands)
        assert [k for k, n in keys.items() if n > 1] == [], command  # one attribute of the parsed flags each
    assert all(s.env_name == "ROOFLIGHT_" + s.key.upper() for s in run)
    assert {s.key for s in run if not s.env} == {"detectors", "check_only"}  # the two without a twin


def test_a_setting_run_and_proxy_share_reads_the_same_in_both() -> None:
    """--slo, --tenant-header, --tenant-top and the buckets: one declaration, one help line, in both commands."""
    parsers = _subparsers()
    shared = [s for s in st.SETTINGS if {st.RUN, st.PROXY} <= set(s.commands)]
    assert {s.key for s in shared} >= {"slo", "tenant_header", "tenant_top", "proxy_buckets"}
    for s in shared:
        helps = {command: next(a.help for a in parsers[command]._actions if s.flag(command) in a.option_strings)
                 for command in (st.RUN, st.PROXY)}
        assert helps[st.RUN] == helps[st.PROXY] == s.help


def test_the_layers_read_the_declarations() -> None:
    """The environment's names and the file's keys are the declared ones (nothing listed by hand elsewhere)."""
    from rooflight.agent.config import agent

    assert agent.ENV_KEYS == {s.key for s in st.SETTINGS if st.RUN in s.commands and s.env}
    env = agent.env_settings({s.env_name: "x" for s in st.SETTINGS if st.RUN in s.commands and s.env})
    assert set(env) == agent.ENV_KEYS
    assert st.TARGET_KEYS == {"url", "name"} | {f for f in agent.TargetConfig.__slots__ if f not in ("url", "name")}
    assert {s.key for s in st.AGENT} | {"targets"} == set(agent.AgentConfig.__slots__) - set(st.PROXY_KEYS)


def test_run_and_plan_share_the_model_gpu_tp_dtypes_and_slos() -> None:
    """One declaration each, offered by both commands, each command reading it its own way (its help, its
    defaults), and plan's flags in the order its --help always had them."""
    parsers = _subparsers()
    shared = {s.key for s in st.SETTINGS if {st.RUN, st.PLAN} <= set(s.commands)}
    assert shared >= {"model", "model_config", "gpu", "tp", "kv_dtype", "weight_dtype", "ttft_slo", "itl_slo"}
    for key in shared:
        run = next(a for a in parsers[st.RUN]._actions if a.dest == key)
        plan = next(a for a in parsers[st.PLAN]._actions if a.dest == key)
        assert run.option_strings == plan.option_strings, key
    assert [s.key for s in st.offered(st.PLAN)][:4] == ["model", "model_config", "gpu", "tp"]
    # neither defaults the flag: plan sizes on h100-sxm unless --gpu or the live agent's page names one
    assert parsers[st.PLAN].parse_args([]).gpu is None and parsers[st.RUN].parse_args([]).gpu is None


def test_the_rules_defaults_are_the_rules_configs() -> None:
    from rooflight.rules.config import RulesConfig

    args = _subparsers()[st.RULES].parse_args([])
    base = RulesConfig()
    assert (args.low_mbu_threshold, args.agent_job_selector, args.hol_for, args.hol_severity) == (
        base.low_mbu_threshold, base.agent_job_selector, base.detector_alert("head_of_line").for_, "warning")
