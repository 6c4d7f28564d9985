"""dashboards/validate.sh type-checks each panel's plugin options with the npm grafana-foundation-sdk's types.

The npm SDK is pinned to the version of the Python SDK that generates the dashboards; the check passes on
the checked-in dashboards and fails, naming the panel, on an unknown option key, an option of the wrong
type, or a panel type the SDK has no types for. The tsgen tests need nothing outside Python; the
validate.sh tests need node and npm (skipped without them, failed under CI=true, where .ci/install
provides them and .ci/test has already filled the npm cache).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from rooflight.dashboards import tsgen
from dashboard_queries import dashboards
from support import ROOT

VALIDATE = ROOT / "dashboards" / "validate.sh"
# One xdist worker runs this file's tests one after another (.ci/test: -n 2 --dist loadgroup): the first
# validate.sh run installs the pinned npm packages into the shared cache, which two at once would race on.
pytestmark = pytest.mark.xdist_group("npm-cache")
JSON_DIR = ROOT / "dashboards" / "json"


def _cache() -> Path:
    """The npm cache validate.sh installs into: CI's (ROOFLIGHT_CACHE_DIR) when there, else the checkout's."""
    base = Path(os.environ.get("ROOFLIGHT_CACHE_DIR", "/var/cache/rooflight"))
    return base / "grafana-schema" if base.is_dir() else ROOT / ".cache" / "grafana-schema"


def _validate(json_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"dashboards/validate.sh needs {', '.join(missing)} (.ci/install installs them)")
    (tmp_path / "work").mkdir()  # validate.sh works in $TMPDIR, and keeps the files of a failed check there
    env = {**os.environ, "TMPDIR": str(tmp_path / "work")}
    return subprocess.run(["bash", str(VALIDATE), str(_cache()), str(json_dir)],
                          capture_output=True, text=True, timeout=240, env=env)


def _broken_copy(tmp_path: Path, name: str, kind: str, breaks: Callable[[dict[str, Any]], None]) -> str:
    """Copy every dashboard to tmp_path, break the first `kind` panel of `name`; its tsgen file stem."""
    for f in JSON_DIR.glob("*.json"):
        shutil.copy(f, tmp_path / f.name)
    d = dashboards()[name]
    panel = next(p for p in tsgen.panels(d) if p["type"] == kind)
    breaks(panel)
    (tmp_path / name).write_text(json.dumps(d), encoding="utf-8")
    return f"{name.removesuffix('.json')}/panel-{panel['id']}-{tsgen.slug(panel['title'])}.ts"


def _error_files(output: str) -> set[str]:
    """The files tsc reports errors in (`file(line,col): error TSnnnn: ...`)."""
    return set(re.findall(r"^(\S+\.ts)\(\d+,\d+\): error TS", output, re.MULTILINE))


# -- the pin -------------------------------------------------------------------------------------------
def test_the_npm_sdk_is_the_python_sdks_version() -> None:
    npm = re.search(r"^GRAFANA_FOUNDATION_SDK_VERSION=(\S+)", VALIDATE.read_text(), re.MULTILINE)
    python = re.search(r'"grafana-foundation-sdk~=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert npm and python, "the pins moved: update this test"
    assert npm.group(1) == python.group(1)
    try:
        installed = importlib.metadata.version("grafana-foundation-sdk")
    except importlib.metadata.PackageNotFoundError:
        return  # the dashboards extra is not installed here; the two pins above still agree
    assert installed.lstrip("v") == npm.group(1)


# -- tsgen, against a stand-in SDK ---------------------------------------------------------------------
def _fake_sdk(root: Path, folders: dict[str, str]) -> Path:
    """An SDK layout with only what tsgen reads: each folder's panelBuilder (its plugin id) and types."""
    for folder, plugin in folders.items():
        (root / "dist" / folder).mkdir(parents=True)
        (root / "dist" / folder / "panelBuilder.gen.js").write_text(f'this.internal.type = "{plugin}";\n')
        (root / "dist" / folder / "types.gen.d.ts").write_text("export interface Options {}\n")
    return root


def test_tsgen_maps_a_plugin_to_the_sdk_folder_that_builds_it(tmp_path: Path) -> None:
    sdk = _fake_sdk(tmp_path, {"statetimeline": "state-timeline"})
    d = {"panels": [{"type": "row", "panels": [{"id": 4, "title": "Pods / state", "type": "state-timeline",
                                                 "options": {}, "fieldConfig": {"defaults": {"custom": {}}}}]}]}
    files = tsgen.render("board", d, sdk)
    assert set(files) == {"board/dashboard.ts", "board/panel-4-pods-state.ts"}
    panel = files["board/panel-4-pods-state.ts"]
    assert "'@grafana/grafana-foundation-sdk/dist/statetimeline/types.gen'" in panel
    assert "export const options: Lit<sdk.Options>" in panel
    # no FieldConfig declared for this plugin: its custom field config must stay empty
    assert "export const custom: Record<string, never>" in panel


def test_tsgen_refuses_a_panel_type_without_sdk_types(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sdk = _fake_sdk(tmp_path / "sdk", {"timeseries": "timeseries"})
    board = tmp_path / "board.json"
    board.write_text(json.dumps({"panels": [{"id": 9, "title": "Clock", "type": "grafana-clock-panel"}]}))
    assert tsgen.main(["--sdk", str(sdk), "--out", str(tmp_path / "out"), str(board)]) == 1
    err = capsys.readouterr().err
    assert "'Clock'" in err and "'grafana-clock-panel'" in err and "no generated types" in err


# -- validate.sh, with node and the pinned npm packages ------------------------------------------------
@pytest.mark.node
def test_validate_sh_passes_on_the_checked_in_dashboards(tmp_path: Path) -> None:
    result = _validate(JSON_DIR, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(dashboards())} dashboards type-check" in result.stdout
    assert "@grafana/grafana-foundation-sdk@" in result.stdout


@pytest.mark.node
def test_validate_sh_names_a_timeseries_panel_with_an_unknown_option(tmp_path: Path) -> None:
    bad = _broken_copy(tmp_path, "rooflight-overview.json", "timeseries",
                       lambda p: p["options"].update(legendPosition="left"))
    result = _validate(tmp_path, tmp_path)
    assert result.returncode == 1
    assert _error_files(result.stdout) == {bad}, result.stdout + result.stderr
    assert "'\"legendPosition\"' does not exist" in result.stdout


@pytest.mark.node
def test_validate_sh_names_a_table_panel_with_an_option_of_the_wrong_type(tmp_path: Path) -> None:
    bad = _broken_copy(tmp_path, "rooflight-kv-batch.json", "table", lambda p: p["options"].update(showHeader="yes"))
    result = _validate(tmp_path, tmp_path)
    assert result.returncode == 1
    assert _error_files(result.stdout) == {bad}, result.stdout + result.stderr
    assert "Type 'string' is not assignable to type 'boolean'" in result.stdout


@pytest.mark.node
def test_validate_sh_names_a_wrong_custom_field_config_value(tmp_path: Path) -> None:
    bad = _broken_copy(tmp_path, "rooflight-gpu.json", "timeseries",
                       lambda p: p["fieldConfig"]["defaults"]["custom"].update(showPoints="sometimes"))
    result = _validate(tmp_path, tmp_path)
    assert result.returncode == 1
    assert _error_files(result.stdout) == {bad}, result.stdout + result.stderr
    assert "'\"sometimes\"' is not assignable" in result.stdout


@pytest.mark.node
def test_validate_sh_fails_on_a_panel_type_without_sdk_types(tmp_path: Path) -> None:
    _broken_copy(tmp_path, "rooflight-gpu.json", "timeseries", lambda p: p.update(type="grafana-clock-panel"))
    result = _validate(tmp_path, tmp_path)
    assert result.returncode == 1
    assert "'grafana-clock-panel'" in result.stderr and "no generated types" in result.stderr
