"""Coverage-guided fuzzing (atheris, libFuzzer) of what reads untrusted input: the exposition reader
plus the vLLM adapter, the agent's config, and the web config. The long run to tests/collectors/test_fuzz.py's
bounded hypothesis run. atheris is optional (bench only): `pip install atheris` (CPython 3.11 wheels).

    python bench/fuzz_atheris.py expfmt -atheris_runs=2000000      # or -max_total_time=3600
    python bench/fuzz_atheris.py config -max_total_time=600
    python bench/fuzz_atheris.py webconfig -max_total_time=600

A crash is any exception other than the module's own error (ParseError/SourceError, ConfigError), a
page that expfmt.select and expfmt.parse read differently, or a negative or non-finite number out of the
adapter; libFuzzer writes the input to crash-<sha1>.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import atheris  # noqa: E402

with atheris.instrument_imports():
    import yaml

    from rooflight.agent.serve import webconfig
    from rooflight.agent.config.agent import build
    from rooflight.agent.errors import ConfigError
    from rooflight.collectors import expfmt
    from rooflight.collectors import vllm
    from rooflight.collectors.errors import ParseError, SourceError


def fuzz_expfmt(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    try:
        expfmt.parse(text)
    except ParseError:
        pass
    selected = expfmt.select(text, vllm.NAMES, prefixes=("vllm:",)).by_name
    parsed = expfmt._read(text, prefixes=("vllm:",), names=vllm.NAMES, bounds=None).by_name
    if repr(selected) != repr(parsed):  # repr: a NaN value equals a NaN
        raise AssertionError("select() and parse() read different samples")
    try:
        sample = vllm.parse(text, target="t", timestamp=0.0, duration=0.0)
    except SourceError:
        return
    for s in sample.series:
        for v in (s.running, s.waiting, s.kv_usage_ratio, s.generation_tokens_total, s.prompt_tokens_total):
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise AssertionError(f"adapter returned {v!r}")


def _yaml(data: bytes) -> object:
    try:
        return yaml.safe_load(data.decode("utf-8", errors="replace"))
    except yaml.YAMLError:
        return None


def fuzz_config(data: bytes) -> None:
    settings = _yaml(data)
    if not isinstance(settings, dict):
        return
    try:
        build(settings, {}, {})
    except ConfigError:
        pass


def fuzz_webconfig(data: bytes) -> None:
    try:
        webconfig.parse(_yaml(data), base=Path("/nonexistent"))
    except ConfigError:
        pass


TARGETS = {"expfmt": fuzz_expfmt, "config": fuzz_config, "webconfig": fuzz_webconfig}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(TARGETS)}}} [libFuzzer flags]")
    name = sys.argv.pop(1)
    atheris.Setup(sys.argv, TARGETS[name])
    atheris.Fuzz()
