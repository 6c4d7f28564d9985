"""One version, written in agent/__init__.py: the package metadata, `rooflight --version`, the build-info
series, the changelog's newest release and every deploy file that names an image or chart version agree."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version

import yaml

from rooflight.agent import __version__
from support import ROOT


def test_the_installed_metadata_and_the_command_say_the_package_version() -> None:
    assert version("rooflight") == __version__
    out = subprocess.run([sys.executable, "-m", "rooflight", "--version"], capture_output=True, text=True, check=True)
    assert __version__ in out.stdout


def test_the_changelog_newest_release_is_this_version() -> None:
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert released and released[0] == __version__, released


def test_the_chart_and_the_manifests_name_this_version() -> None:
    chart = yaml.safe_load((ROOT / "deploy/helm/rooflight/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    named = {
        "deploy/k8s/base/deployment.yaml": rf"ghcr\.io/rooflight/rooflight:{re.escape(__version__)}\b",
        "deploy/k8s/overlays/demo/kustomization.yaml": rf"newTag: {re.escape(__version__)}\b",
        "deploy/compose/compose.yaml": rf"rooflight:{re.escape(__version__)}\b",
        "deploy/Dockerfile": rf"ROOFLIGHT_VERSION={re.escape(__version__)}\b",
    }
    for path, pattern in named.items():
        assert re.search(pattern, (ROOT / path).read_text()), f"{path} does not name version {__version__}"
