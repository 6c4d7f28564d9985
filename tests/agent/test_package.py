"""The wheel installs one top-level package, `rooflight`, and nothing named agent, collectors, rules or dashboards.

The wheel is built from the checkout and installed into an empty folder; a fresh interpreter that sees only
that folder and the test environment's third-party packages (no .pth files, so not the editable install)
must run `python -m rooflight --help` and must not find the generic names.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from support import ROOT

GENERIC = ("agent", "collectors", "rules", "dashboards", "deploy", "tests")
# One xdist worker runs this file (.ci/test: --dist loadgroup): `pip wheel` builds in the checkout (build/,
# *.egg-info), which two builds at once would race on; and the module's wheel is then built once.
pytestmark = pytest.mark.xdist_group("wheel")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (built,) = out.glob("rooflight-*.whl")
    return built


def _isolated(target: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run python with `target` and the third-party packages on its path, and no site hooks."""
    path = f"{target}:{sysconfig.get_paths()['purelib']}"
    return subprocess.run([sys.executable, "-S", *args], cwd=target, env={"PYTHONPATH": path},
                          capture_output=True, text=True, timeout=120)


def test_the_wheel_has_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"rooflight"}
    for part in ("agent", "collectors", "rules", "dashboards"):
        assert f"rooflight/{part}/__init__.py" in names
    assert "rooflight/__main__.py" in names and "rooflight/dashboards/json/rooflight-overview.json" in names
    assert "rooflight/agent/serve/static/status.html" in names  # the status page ships with the package
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "rooflight = rooflight.agent.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_installed_wheel_runs_and_shadows_nothing(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin") == ["rooflight"]
    assert (target / "bin" / "rooflight").exists()  # the console script
    probe = ("import importlib.util, rooflight; print(rooflight.__file__); "
             f"print([n for n in {GENERIC!r} if importlib.util.find_spec(n)])")
    out = _isolated(target, "-c", probe)
    assert out.returncode == 0, out.stderr
    where, found = out.stdout.splitlines()
    assert where.startswith(str(target)) and found == "[]"
    helped = _isolated(target, "-m", "rooflight", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "usage: rooflight" in helped.stdout and "demo" in helped.stdout


def _package_dir(package: str, package_dirs: dict[str, str]) -> Path:
    """A package's folder in the checkout, by the longest prefix [tool.setuptools.package-dir] maps."""
    prefix = max((p for p in package_dirs if package == p or package.startswith(p + ".")), key=len)
    return ROOT / package_dirs[prefix] / package[len(prefix):].lstrip(".").replace(".", "/")


def test_every_package_data_glob_matches_a_file() -> None:
    """A glob that matches nothing says data ships that does not (or never did): each must find a file,
    "*" in at least one package."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {p: _package_dir(p, setuptools["package-dir"]) for p in setuptools["packages"]}
    assert all(d.is_dir() for d in dirs.values()), dirs
    empty = [
        f"{package}: {glob}"
        for package, globs in setuptools["package-data"].items()
        for glob in globs
        if not any(any(d.glob(glob)) for p, d in dirs.items() if package in ("*", p))
    ]
    assert not empty, f"package-data globs that match no file: {empty}"
