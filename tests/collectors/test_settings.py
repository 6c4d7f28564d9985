"""The engine settings every adapter exports (rooflight_engine_config_info): one spelling of a value
whatever the engine wrote, and nothing but each adapter's fixed list (docs/engines.md "Engine settings")."""

from __future__ import annotations

import re

import pytest

from rooflight.collectors import engines
from rooflight.collectors.samples import MAX_SETTING_CHARS, setting_value, settings_from
from support import ROOT

# The series labels beside the settings, and those Prometheus attaches or reserves (a setting of that name
# would be renamed exported_<name> at scrape time, or clash with a histogram's or summary's own label).
RESERVED = {"target", "engine", "model", "rank", "cluster", "namespace", "pod", "job", "instance", "le", "quantile"}


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        (True, "true"), (False, "false"), ("True", "true"), ("False", "false"),  # JSON and vLLM's labels
        (8192, "8192"), (8192.0, "8192"), (10**80, ("1" + "0" * 80)[:MAX_SETTING_CHARS]), (0.88, "0.88"), (-1, "-1"), ("fp8_e4m3", "fp8_e4m3"), (" lpm ", "lpm"),
        (None, None), ("None", None), ("null", None), ("", None), (float("nan"), None), (float("inf"), None),
        ([1, 2], None), ({"a": 1}, None),
    ],
)
def test_a_setting_is_spelled_one_way(raw: object, label: str | None) -> None:
    assert setting_value(raw) == label


def test_only_the_allowlist_is_kept_and_values_are_cut() -> None:
    values = {"chunked_prefill_size": 2048, "api_key": "secret", "schedule_policy": "x" * 500, "page_size": None}
    got = settings_from(values, ("chunked_prefill_size", "schedule_policy", "page_size"))
    assert got == {"chunked_prefill_size": "2048", "schedule_policy": "x" * MAX_SETTING_CHARS}


def _declared(adapter: object) -> tuple[str, ...]:
    return (*getattr(adapter, "SETTINGS", ()), *getattr(adapter, "INFO_SETTINGS", ()))


@pytest.mark.parametrize("engine", engines.names())
def test_declared_settings_are_label_names_and_not_the_series_labels(engine: str) -> None:
    keys = _declared(engines.adapter(engine))
    assert len(keys) == len(set(keys)) <= 20, "a fixed, short list keeps the info metric's labels few"
    for key in keys:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", key) and key not in RESERVED, key


def test_the_doc_lists_every_setting_each_adapter_exports() -> None:
    section = (ROOT / "docs" / "engines.md").read_text().split("### Engine settings", 1)[1].split("\n## ", 1)[0]
    for engine in engines.names():
        for key in _declared(engines.adapter(engine)):
            assert f"`{key}`" in section, f"docs/engines.md Engine settings does not list {engine}'s {key}"
