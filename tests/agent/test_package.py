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


def _requirement_names(dist: str, extras: tuple[str, ...] = ()) -> set[str]:
    """`dist` and every distribution it requires, with `extras`, transitively (normalised names)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [(dist, extras)]
    while todo:
        name, wanted = todo.pop()
        key = name.lower().replace("_", "-")
        if (key, wanted) in seen:
            continue
        seen.add((key, wanted))  # type: ignore[arg-type]
        for line in metadata.requires(name) or ():
            req = Requirement(line)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, tuple(sorted(req.extras))))
    return {k for k, _ in seen}  # type: ignore[misc]


# Where the checkout's own modules live, by their first name: the package's parts (pyproject.toml's
# package-dir), the bench scripts tests import, and the tests' own helpers.
OWN = {"rooflight": ROOT / "agent" / "_root", "bench": ROOT / "bench", "deploy": ROOT / "deploy", "tests": ROOT / "tests"}
PARTS = {"rooflight.agent": ROOT / "agent", "rooflight.collectors": ROOT / "collectors",
         "rooflight.rules": ROOT / "rules", "rooflight.dashboards": ROOT / "dashboards"}


def _own_file(module: str) -> Path | None:
    """The checkout's file for a dotted module name, if it is the checkout's own."""
    for prefix, folder in sorted({**PARTS, **OWN}.items(), key=lambda kv: -len(kv[0])):
        if module == prefix or module.startswith(prefix + "."):
            rest = module[len(prefix):].lstrip(".").split(".") if module != prefix else []
            for candidate in (folder.joinpath(*rest).with_suffix(".py") if rest else None,
                              folder.joinpath(*rest, "__init__.py")):
                if candidate is not None and candidate.is_file():
                    return candidate
            return folder if folder.is_dir() else None
    for folder in (ROOT / "tests", ROOT / "bench"):  # helpers imported by their bare name (pythonpath, sys.path)
        hits = list(folder.rglob(module.split(".")[0] + ".py"))
        if hits:
            return hits[0]
    return None


def test_the_test_extra_installs_every_package_the_tests_import() -> None:
    """`pip install '.[test]'` is all a contributor needs for pytest: every third-party module that a test
    file imports, or that the checkout's modules it imports import in turn, comes from a distribution that
    rooflight[test] requires. The real-engine stage's files are its own: .ci/real-engine.sh installs their
    environment (vLLM, torch, gguf). An import under `try: ... except ImportError` is optional by design
    (bench/gpu_check.py's torch, on a GPU machine)."""
    import ast
    from importlib import metadata

    provided = metadata.packages_distributions()
    needed = _requirement_names("rooflight", ("test",))
    todo = [p for p in (ROOT / "tests").rglob("*.py") if "real_engine" not in p.parts]
    seen: set[Path] = set()
    missing = set()
    while todo:
        path = todo.pop()
        if path in seen or path.is_dir():
            continue
        seen.add(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        optional = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) and any(
                    isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in t.handlers)
                    for stmt in t.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                own = _own_file(name)
                if own is not None:
                    todo.append(own)
                elif top not in sys.stdlib_module_names and _own_file(top) is None:
                    if not {d.lower().replace("_", "-") for d in provided.get(top, [])} & needed:
                        missing.add(f"{top} ({path.relative_to(ROOT)})")
    assert not missing, f"imported for the tests, not installed by rooflight[test]: {sorted(missing)}"
