"""`python -m rooflight.regen`: one command writes every generated file; `--check` (which CI runs) finds a stale one."""

from __future__ import annotations

from pathlib import Path

import pytest

from rooflight import regen
from support import ROOT


def test_every_generated_file_is_fresh() -> None:
    assert regen.stale() == [], "run `python -m rooflight.regen`"


def _in_tree(path: Path) -> str:
    root = regen.ROOT if path.is_relative_to(regen.ROOT) else ROOT
    return path.relative_to(root).as_posix()


def test_it_covers_the_rules_dashboards_deploy_files_and_docs() -> None:
    # Each path relative to the tree it sits in: under .ci/test the package (regen.ROOT) is the checkout's editable
    # install while deploy/ is imported from the copy the suite runs in (ROOT).
    paths = {_in_tree(p) for p in regen.generated()}
    assert {"rules/rooflight.rules.yaml", "dashboards/json/rooflight-kv-batch.json",
            "deploy/helm/rooflight/templates/prometheusrule.yaml", "deploy/helm/rooflight/values.yaml",
            "docs/metrics.md", "docs/detectors.md", "docs/metric-contract.md", "docs/engines.md"} <= paths


def test_a_stale_table_is_found_and_a_document_without_its_markers_is_an_error() -> None:
    block = regen.blocks()[2]  # docs/detectors.md's table
    doc = (ROOT / block.path).read_text()
    assert block.render_into(doc) == doc
    stale = doc.replace("| `head_of_line` |", "| `head_of_lines` |")
    assert block.render_into(stale) == doc  # the table is written whole again
    with pytest.raises(ValueError, match="lacks the markers"):
        block.render_into(doc.replace(block.begin, ""))


def test_ci_runs_the_check() -> None:
    assert "-m rooflight.regen --check" in (ROOT / ".ci" / "test").read_text()
