"""Render every dashboard to dashboards/json/, or (--check) fail when the checked-in JSON is stale.

    python -m rooflight.dashboards.generate          # rewrite dashboards/json/*.json
    python -m rooflight.dashboards.generate --check  # exit 1 and name the stale files; writes nothing
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from . import fleet, gpu, kvbatch, overview, roofline

JSON_DIR = Path(__file__).resolve().parent / "json"

DASHBOARDS: dict[str, Callable[[], dict[str, Any]]] = {
    "rooflight-overview.json": overview.dashboard,
    "rooflight-roofline.json": roofline.dashboard,
    "rooflight-kv-batch.json": kvbatch.dashboard,
    "rooflight-gpu.json": gpu.dashboard,
    "rooflight-fleet.json": fleet.dashboard,
}


def render_all() -> dict[str, str]:
    """File name -> JSON text (sorted keys, 2-space indent, trailing newline), deterministic."""
    return {name: json.dumps(build(), indent=2, sort_keys=True) + "\n" for name, build in DASHBOARDS.items()}


def stale(json_dir: Path = JSON_DIR) -> list[str]:
    """Names of files that are missing, differ from the generated text, or are not generated at all."""
    rendered = render_all()
    bad = [name for name, text in rendered.items() if not (json_dir / name).is_file()
           or (json_dir / name).read_text(encoding="utf-8") != text]
    extra = sorted(p.name for p in json_dir.glob("*.json") if p.name not in rendered)
    return sorted(bad) + extra


def write_all(json_dir: Path = JSON_DIR) -> list[Path]:
    json_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        path = json_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rooflight.dashboards.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if dashboards/json/ differs from the code")
    parser.add_argument("--out", type=Path, default=JSON_DIR, help="directory of the JSON files")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale(args.out)
        if bad:
            print(f"stale dashboards in {args.out}: {', '.join(bad)}; run python -m rooflight.dashboards.generate",
                  file=sys.stderr)
            return 1
        print(f"{len(DASHBOARDS)} dashboards up to date")
        return 0
    for path in write_all(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
