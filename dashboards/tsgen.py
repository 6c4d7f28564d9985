"""Write the TypeScript that dashboards/validate.sh type-checks with `tsc --noEmit`.

Per dashboard, one file types the whole dashboard with npm @grafana/schema, which leaves a panel plugin's
`options` and `fieldConfig.defaults.custom` untyped; then one file per panel types those two (and each
`custom.*` override value) with the generated types of npm @grafana/grafana-foundation-sdk for the panel's
plugin (dist/<plugin>/types.gen.d.ts: Options, FieldConfig). Each file is named after its dashboard, panel
id and title, so every tsc error names the panel. A panel type the SDK has no types for is an error here.

    python dashboards/tsgen.py --sdk NODE_MODULES/@grafana/grafana-foundation-sdk --out DIR DASHBOARD.json...

Standard library only: validate.sh runs it as a plain script.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

SDK = "@grafana/grafana-foundation-sdk"
# String enums (ThresholdsMode, LegendDisplayMode, ...) as their literal values, which is what JSON holds.
LIT = "type Lit<T> = T extends string ? `${T}` : T extends object ? { [K in keyof T]: Lit<T[K]> } : T;"
# An annotation's query and formats are its datasource's: @grafana/schema leaves them open
# (AnnotationQuery<TQuery>), so they are checked here as Prometheus': the query in `target`, the
# title/text/tag formats on the annotation, where Grafana's Prometheus annotation support reads them.
DASHBOARD_TYPES = """\
import type { AnnotationQuery, Dashboard, DataQuery } from '@grafana/schema';
interface PromQuery extends DataQuery { expr: string; interval?: string; instant?: boolean; range?: boolean; legendFormat?: string }
type PromAnnotation = AnnotationQuery<PromQuery> & { titleFormat?: string; textFormat?: string; tagKeys?: string; useValueForTime?: boolean };
type Checked = Omit<Dashboard, 'annotations'> & { annotations?: { list?: PromAnnotation[] } };
"""


class MissingTypes(Exception):
    """A panel whose plugin has no generated types in the SDK: it would otherwise go unchecked."""


def sdk_plugins(sdk: Path) -> dict[str, str]:
    """Panel plugin id -> SDK folder, as each dist/<folder>/panelBuilder.gen.js sets it (e.g. state-timeline)."""
    found: dict[str, str] = {}
    for builder in sorted((sdk / "dist").glob("*/panelBuilder.gen.js")):
        match = re.search(r'\.type = "([^"]+)"', builder.read_text(encoding="utf-8"))
        if match:
            found[match.group(1)] = builder.parent.name
    return found


def has_field_config(sdk: Path, folder: str) -> bool:
    """Whether the plugin declares a custom field config (stat, for one, has none)."""
    text = (sdk / "dist" / folder / "types.gen.d.ts").read_text(encoding="utf-8")
    return re.search(r"^export (?:interface|type) FieldConfig\b", text, re.MULTILINE) is not None


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row, including those inside collapsed rows."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panels(panel)
        else:
            yield panel


def slug(text: str) -> str:
    """A file-name-safe, still readable form of a title."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "untitled"


def literal(value: Any) -> str:
    """A JSON value as a TypeScript object literal (JSON is valid TypeScript)."""
    return json.dumps(value, indent=2, sort_keys=True)


def dashboard_ts(dashboard: dict[str, Any]) -> str:
    """The whole dashboard as an object literal, so unknown keys are excess-property errors."""
    return f"{DASHBOARD_TYPES}{LIT}\nexport const dashboard: Lit<Checked> = {literal(dashboard)};\n"


def panel_ts(panel: dict[str, Any], folder: str, field_config: bool) -> str:
    """The panel's plugin options and custom field config, typed with the SDK's types for its plugin."""
    lines = [f"// panel {panel.get('title')!r} (id {panel.get('id')}, type {panel.get('type')})",
             f"import type * as sdk from '{SDK}/dist/{folder}/types.gen';", LIT]
    if "options" in panel:
        lines.append(f"export const options: Lit<sdk.Options> = {literal(panel['options'])};")
    # A plugin without a FieldConfig (stat) reads no custom field config: any key there is an error.
    custom_type = "Lit<sdk.FieldConfig>" if field_config else "Record<string, never>"
    field = panel.get("fieldConfig", {})
    if "custom" in field.get("defaults", {}):
        lines.append(f"export const custom: {custom_type} = {literal(field['defaults']['custom'])};")
    for i, override in enumerate(field.get("overrides", [])):
        for j, prop in enumerate(override.get("properties", [])):
            key = str(prop.get("id", ""))
            if key.startswith("custom."):
                lines.append(f"export const override_{i}_{j}: NonNullable<{custom_type}[{json.dumps(key[7:])}]>"
                             f" = {literal(prop.get('value'))};")
    return "\n".join(lines) + "\n"


def render(name: str, dashboard: dict[str, Any], sdk: Path) -> dict[str, str]:
    """Relative file path -> TypeScript for one dashboard; raises MissingTypes naming the panel."""
    plugins = sdk_plugins(sdk)
    files = {f"{name}/dashboard.ts": dashboard_ts(dashboard)}
    for index, panel in enumerate(panels(dashboard)):
        kind = panel.get("type")
        title = str(panel.get("title", ""))
        if kind not in plugins:
            raise MissingTypes(f"{name}: panel {title!r} (id {panel.get('id')}) has type {kind!r}, for which {SDK} "
                               f"has no generated types: its options would go unchecked")
        file = f"{name}/panel-{panel.get('id', index)}-{slug(title)}.ts"
        files[file] = panel_ts(panel, plugins[kind], has_field_config(sdk, plugins[kind]))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdk", type=Path, required=True, help=f"the installed {SDK} package folder")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the .ts files into")
    parser.add_argument("dashboards", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if not sdk_plugins(args.sdk):
        print(f"tsgen: no panel types found under {args.sdk}/dist: is {SDK} installed there?", file=sys.stderr)
        return 1
    for path in args.dashboards:
        try:
            files = render(path.stem, json.loads(path.read_text(encoding="utf-8")), args.sdk)
        except MissingTypes as e:
            print(f"tsgen: {e}", file=sys.stderr)
            return 1
        for rel, text in files.items():
            (args.out / rel).parent.mkdir(parents=True, exist_ok=True)
            (args.out / rel).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
