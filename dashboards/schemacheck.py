"""Validate dashboard JSON against the pinned Grafana JSON schemas in dashboards/schema/.

Checks the whole dashboard against the classic dashboard schema, then each panel's `options` and
`fieldConfig.defaults.custom` against its panel plugin's schema. Needs `jsonschema` (a test dependency).
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_DIR = Path(__file__).resolve().parent / "schema"
ANY: dict[str, Any] = {}  # JSON Schema for "any value"


def _relax(schema: dict[str, Any]) -> dict[str, Any]:
    """Undo the generator's `_` -> object typing (see schema/README.md); nothing else is changed."""
    defs = schema.get("definitions", {})
    if "MatcherConfig" in defs:
        defs["MatcherConfig"]["properties"]["options"] = ANY
    if "DynamicConfigValue" in defs:
        defs["DynamicConfigValue"]["properties"]["value"] = ANY
    return schema


@lru_cache(maxsize=None)
def _load(name: str) -> dict[str, Any]:
    return _relax(json.loads((SCHEMA_DIR / f"{name}.jsonschema.json").read_text(encoding="utf-8")))


def _validator(name: str, definition: str | None = None) -> jsonschema.Draft7Validator:
    schema = dict(_load(name))
    if definition:
        schema["$ref"] = f"#/definitions/{definition}"
    return jsonschema.Draft7Validator(schema)


def _describe(where: str, error: jsonschema.ValidationError) -> list[str]:
    """An anyOf/oneOf failure (panel or row?) is reported by the branch that came closest to matching."""
    errors = [error]
    if error.context:
        branches: dict[object, list[jsonschema.ValidationError]] = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        errors = min(branches.values(), key=len)
    return [f"{where} {list(e.absolute_path)}: {e.message[:300]}" for e in errors]


# Panel types whose plugin options have no pinned JSON schema here: the panel itself (type, targets, gridPos,
# field config) is still type-checked against @grafana/schema by dashboards/validate.sh; only its plugin
# `options` go unchecked. The table panel ("Engine settings") sets none beyond Grafana's defaults.
OPTIONS_UNPINNED = frozenset({"table"})


def panel_types() -> set[str]:
    """Panel types we hold a schema for (anything else is reported as an error)."""
    return {p.name.split(".")[0] for p in SCHEMA_DIR.glob("*.jsonschema.json")} - {"dashboard"}


def schema_errors(dashboard: dict[str, Any]) -> list[str]:
    """Human-readable schema violations; empty when the dashboard is valid."""
    errors = [line for e in _validator("dashboard").iter_errors(dashboard) for line in _describe("dashboard", e)]
    for panel in dashboard.get("panels", []):
        kind = panel.get("type")
        if kind == "row":
            continue
        where = f"panel {panel.get('title')!r} ({kind})"
        if kind in OPTIONS_UNPINNED:
            continue
        if kind not in panel_types():
            errors.append(f"{where}: no pinned schema for this panel type")
            continue
        for e in _validator(kind, "Options").iter_errors(panel.get("options", {})):
            errors.append(f"{where} options {list(e.absolute_path)}: {e.message[:300]}")
        if "FieldConfig" in _load(kind).get("definitions", {}):
            custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
            for e in _validator(kind, "FieldConfig").iter_errors(custom):
                errors.append(f"{where} fieldConfig.defaults.custom {list(e.absolute_path)}: {e.message[:300]}")
    return errors


def main(argv: list[str]) -> int:
    bad = 0
    for path in argv:
        for line in schema_errors(json.loads(Path(path).read_text(encoding="utf-8"))):
            print(f"{path}: {line}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
