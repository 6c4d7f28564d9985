"""Fuzzing the parts that read untrusted input: the exposition reader, the vLLM adapter, the agent's
config and the web config. Bounded for CI (a few seconds each); ROOFLIGHT_FUZZ_EXAMPLES raises the count,
and bench/fuzz_atheris.py is the long coverage-guided run.

Properties:
- whatever the text, expfmt.parse raises nothing but ParseError, the vLLM adapter nothing but
  SourceError, and nothing the adapter returns is negative or non-finite;
- differential against prometheus_client on hand-spelled lines (odd spacing, escapes, exponents,
  special values, timestamps): where prometheus_client accepts a page, expfmt gives the same
  samples; where it refuses one (broken lines mixed in), each line is one sample or one counted bad
  line, and every line it accepts on its own is among ours with its value;
- config: any mapping of settings gives an AgentConfig or ConfigError, never another exception;
  any YAML gives a WebConfig or ConfigError; a config file loads what PyYAML reads, or is refused.
(test_expfmt.py already round-trips what prometheus_client renders; this covers what it does not.)
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.serve import webconfig
from rooflight.agent.config.agent import build, load_file
from rooflight.agent.errors import ConfigError
from rooflight.collectors import expfmt
from rooflight.collectors import vllm
from rooflight.collectors.errors import ParseError, SourceError
from support import sample_text

EXAMPLES = int(os.environ.get("ROOFLIGHT_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PAGE_LINES = sample_text("vllm-cpu-load-c16.prom").splitlines()


# -- arbitrary and mutated text -----------------------------------------------------------------------
@st.composite
def _mutated_page(draw: st.DrawFn) -> str:
    """Real vLLM lines, some cut, duplicated, with characters inserted or values swapped."""
    picks = draw(st.lists(st.sampled_from(PAGE_LINES), min_size=1, max_size=40))
    out = []
    for line in picks:
        op = draw(st.sampled_from(["keep", "cut", "insert", "value", "dup"]))
        if op == "cut" and line:
            line = line[: draw(st.integers(0, len(line)))]
        elif op == "insert":
            at = draw(st.integers(0, len(line)))
            line = line[:at] + draw(st.text(st.characters(codec="utf-8"), max_size=6)) + line[at:]
        elif op == "value" and " " in line and not line.startswith("#"):
            value = draw(st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e308", "-0", "0x10", "1_0", "", "1e-320"]))
            line = line.rsplit(" ", 1)[0] + " " + value
        elif op == "dup":
            out.append(line)
        out.append(line)
    return "\n".join(out)


def _vllm_is_safe(text: str) -> None:
    try:
        sample = vllm.parse(text, target="t", timestamp=0.0, duration=0.0)
    except SourceError:
        return
    for series in sample.series:
        for name in ("running", "waiting", "kv_usage_ratio", "prompt_tokens_total", "generation_tokens_total",
                     "steps_total", "preemptions_total", "kv_capacity_tokens"):
            value = getattr(series, name)
            assert value is None or (math.isfinite(value) and value >= 0), (name, value)


@FUZZ
@given(st.text(max_size=400))
def test_any_text_parses_or_is_a_parse_error(text: str) -> None:
    try:
        expfmt.parse(text)
    except ParseError:
        pass
    _vllm_is_safe(text)


@FUZZ
@given(_mutated_page())
def test_mutated_vllm_pages_never_crash_or_go_negative(text: str) -> None:
    try:
        expfmt.parse(text, prefixes=("vllm:",), names=vllm.NAMES)
    except ParseError:
        pass
    _vllm_is_safe(text)


# -- differential against prometheus_client ------------------------------------------------------------
_NAME = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)
_LABEL = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(lambda s: s != "__name__")
_VALUE_CHARS = st.text(st.sampled_from('ab c,}{="\\n\\\\é'), max_size=8)
_NUMBER = st.one_of(
    st.sampled_from(["NaN", "+Inf", "-Inf", "Inf", "1e3", "-2.5E-3", "0", "-0.0", "17", ".5", "5."]),
    st.floats(allow_nan=False).map(repr),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def _spelled_line(draw: st.DrawFn) -> str:
    name = draw(_NAME)
    labels = draw(st.dictionaries(_LABEL, _VALUE_CHARS, max_size=3))
    sp = draw(st.sampled_from(["", " "]))
    body = ",".join(f'{sp}{k}{sp}={sp}"{_escape(v)}"' for k, v in labels.items())
    trailing = draw(st.sampled_from(["", ","])) if labels else ""
    head = f"{name}{{{body}{trailing}}}" if labels or draw(st.booleans()) else name
    ts = draw(st.sampled_from(["", " 1700000000000", " -5"]))
    return f"{head}{draw(st.sampled_from([' ', '  ', chr(9)]))}{draw(_NUMBER)}{ts}"


@st.composite
def _broken_line(draw: st.DrawFn) -> str:
    """A spelled line broken the ways real pages break: cut short, value missing, quote lost, bad number."""
    line = draw(_spelled_line())
    how = draw(st.sampled_from(["cut", "no value", "quote", "number"]))
    if how == "cut":
        return line[: draw(st.integers(1, max(1, len(line) - 1)))]
    if how == "no value":
        return line.rsplit(" ", 1)[0] if " " in line else line + "{"
    if how == "quote":
        return line.replace('"', "", 1) if '"' in line else line + ' "'
    return line.rsplit(" ", 1)[0] + " " + draw(st.sampled_from(["1_0", "0x10", "abc", "--1", ""]))


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _theirs(text: str) -> list[tuple[str, dict[str, str], float, object]] | None:
    """prometheus_client's samples of `text`, or None where it refuses the page."""
    try:
        return [(s.name, s.labels, s.value, s.timestamp) for f in text_string_to_metric_families(text)
                for s in f.samples]
    except Exception:
        return None


@FUZZ
@given(st.lists(_spelled_line(), min_size=1, max_size=8))
def test_hand_spelled_lines_agree_with_prometheus_client(lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    theirs = _theirs(text)
    if theirs is None:  # rare for well-spelled lines; the mixed test below covers refused pages
        return
    ours_exp = expfmt.parse(text)
    ours = [(s.name, s.labels, s.value, s.timestamp) for f in ours_exp.families for s in f.samples]
    assert ours_exp.bad_lines == 0
    assert len(ours) == len(theirs)
    for (n1, l1, v1, t1), (n2, l2, v2, t2) in zip(ours, theirs):
        assert (n1, l1) == (n2, l2)
        assert _same(v1, float(v2))
        assert (t1 is None and t2 is None) or float(t1) == pytest.approx(float(t2))


@FUZZ
@given(st.lists(st.one_of(_spelled_line(), _broken_line()), min_size=1, max_size=8))
def test_a_bad_line_costs_itself_only(lines: list[str]) -> None:
    """Pages prometheus_client refuses as a whole (one broken line is enough): every line is one sample
    or one counted bad line, and every line prometheus_client accepts on its own is among our samples
    with its value. A ParseError only when no line is good."""
    text = "\n".join(lines) + "\n"
    if _theirs(text) is not None:
        return
    alone = [_theirs(line + "\n") for line in lines]
    try:
        page = expfmt.parse(text)
    except ParseError:
        assert not any(alone), "ParseError on a page that has good lines"
        return
    ours = [(s.name, s.labels, s.value) for f in page.families for s in f.samples]
    assert len(ours) + page.bad_lines == len(lines), (len(ours), page.bad_lines, lines)
    for line, theirs in zip(lines, alone):
        if theirs:
            ((name, labels, value, _),) = theirs
            assert any(n == name and lbl == labels and _same(v, value) for n, lbl, v in ours), (line, ours)


# -- configuration ---------------------------------------------------------------------------------------
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["1s", "250ms", "0", "-1s", "10s,1m", "http://x:1", "h100-sxm"]))
_KEYS = st.sampled_from(["engine_url", "interval", "scrape_timeout", "windows", "percentiles", "listen", "nvml",
                         "model", "gpu", "tp", "batch_max", "max_body_bytes", "detectors", "targets", "engine",
                         "bogus", "process", "nvml_interval"])
_SETTINGS = st.dictionaries(st.one_of(_KEYS, st.integers(0, 3), st.none()),  # YAML reads `1:` and `null:` as such
                            st.one_of(_SCALAR, st.lists(_SCALAR, max_size=3),
                                      st.dictionaries(st.text(max_size=6), _SCALAR, max_size=2)), max_size=6)


@FUZZ
@given(_SETTINGS, _SETTINGS)
def test_any_settings_give_a_config_or_a_config_error(file_settings: dict, flags: dict) -> None:
    try:
        build(file_settings, {}, flags)
    except ConfigError:
        pass


_YAML = st.recursive(_SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.one_of(st.sampled_from(["tls_server_config", "basic_auth_users", "http_server_config",
                                               "cert_file", "key_file", "headers", "min_version",
                                               "client_auth_type", "client_ca_file"]), st.text(max_size=5)),
                    inner, max_size=3)), max_leaves=8)


@FUZZ
@given(_YAML)
def test_any_web_config_gives_a_config_or_a_config_error(data: object) -> None:
    try:
        webconfig.parse(data, base=Path("/nonexistent"))
    except ConfigError:
        pass


_NOT_YAML = object()


def _pyyaml(text: str) -> object:
    """What PyYAML's safe_load makes of `text` (our bounded loader extends it), or _NOT_YAML; _NOT_YAML too for
    what our loader refuses on purpose: a mapping that writes a key (or `<<`) twice, where PyYAML keeps the
    last, and a number YAML 1.1 reads surprisingly (1_0 as 10, 010 as 8, 1:30 as 90)."""
    try:
        loaded = yaml.safe_load(text)
        return _NOT_YAML if _refused_on_purpose(yaml.compose(text, Loader=yaml.SafeLoader)) else loaded
    except Exception:  # YAMLError, and ValueError for an impossible date such as 2001-02-30
        return _NOT_YAML


def _refused_on_purpose(node: object) -> bool:
    if isinstance(node, yaml.ScalarNode):
        return node.tag.endswith((":int", ":float")) and re.search(r"_|:|^[-+]?0[0-9]", node.value) is not None
    if isinstance(node, yaml.SequenceNode):
        return any(_refused_on_purpose(v) for v in node.value)
    if isinstance(node, yaml.MappingNode):
        keys = [k.tag if k.tag.endswith(":merge") else yaml.SafeLoader("").construct_object(k)
                for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
        return len(keys) != len(set(keys)) or any(_refused_on_purpose(k) or _refused_on_purpose(v)
                                                  for k, v in node.value)
    return False


def _text_keys_only(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _text_keys_only(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_text_keys_only(v) for v in value)
    return True


@FUZZ
@given(st.text(max_size=200))
@example("tp: 2\ntp: 4\n")  # a key written twice: refused
@example("on: 1\nyes: 2\n")  # one key (true) written two ways: refused
@example("a: &a {x: 1}\nb: {<<: *a, x: 2}\n")  # a merged key overridden: loaded
@example("tp: 1_0\n")  # YAML 1.1's 10: refused
def test_a_config_file_loads_what_yaml_says_or_is_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    """Differential against PyYAML (far below our loader's size and alias bounds): a YAML mapping, or an
    empty file, loads to the same settings; anything else is a ConfigError, never another exception.
    A web config that loads was a mapping of known top-level keys."""
    path = tmp_path_factory.getbasetemp() / "fuzz-config.yml"
    path.write_text(text)
    expected = _pyyaml(text)
    # settings are named by text: a mapping with any other key (`1: 2`, `?`, `on:`) is refused like a non-mapping
    is_mapping = expected is None or (isinstance(expected, dict) and _text_keys_only(expected))
    try:
        loaded = load_file(path)
    except ConfigError:
        assert not is_mapping, f"a valid YAML mapping was refused: {text!r}"
    else:
        assert is_mapping and repr(loaded) == repr(expected or {}), (text, loaded, expected)
    try:
        webconfig.load(path)
    except ConfigError:
        pass
    else:
        assert expected is None or (isinstance(expected, dict) and set(expected) <= webconfig._TOP_KEYS), text
