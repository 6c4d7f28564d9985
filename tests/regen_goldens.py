"""Rewrite the golden files under tests/golden from what the code produces now, then read the diff.

    python tests/regen_goldens.py            # every golden
    python tests/regen_goldens.py -k trtllm  # extra arguments go to pytest

The tests only ever compare with the goldens (support.check_golden); this is the one way to change
one. It runs the tests that call check_golden with ROOFLIGHT_GOLDEN_OUT set, so each writes what it
produced to a scratch folder (and still compares, so changed goldens show as failures in that run),
then copies the scratch files over the goldens. A test writes its text only after its hand-written
checks have passed, so a golden cannot be regenerated past an expectation written in a test.
Afterwards: `git diff tests/golden`, and commit only what you can explain.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from support import GOLDEN, GOLDEN_OUT_ENV, ROOT, TESTS


def golden_tests() -> list[Path]:
    """Every test module that compares with a golden file."""
    return sorted(p for p in TESTS.rglob("test_*.py") if "check_golden(" in p.read_text())


def copy_over(produced: Path) -> list[str]:
    """Copy every produced file over its golden; one line per file saying what changed."""
    lines = []
    for src in sorted(p for p in produced.rglob("*") if p.is_file()):
        dest = GOLDEN / src.relative_to(produced)
        state = "new" if not dest.exists() else "same" if filecmp.cmp(src, dest, shallow=False) else "changed"
        if state != "same":
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        lines.append(f"{state:8} {dest.relative_to(ROOT)}")
    return lines


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="rooflight-golden-") as scratch:
        env = {**os.environ, GOLDEN_OUT_ENV: scratch}
        env.pop("ROOFLIGHT_UPDATE_GOLDEN", None)
        tests = [str(p.relative_to(ROOT)) for p in golden_tests()]
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, *argv],
                             cwd=ROOT, env=env)
        if run.returncode not in (0, 1):  # 1: some test failed (a changed golden does); else pytest broke
            print(f"pytest exited {run.returncode}; no golden rewritten", file=sys.stderr)
            return run.returncode
        lines = copy_over(Path(scratch))
    print("\n".join(lines) or "no golden produced (check the -k selection)")
    print("now read `git diff tests/golden`; failures above other than golden differences still need fixing")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
