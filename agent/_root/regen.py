"""`python -m rooflight.regen`: write every generated file of the checkout from the code, or check them.

    python -m rooflight.regen          # rules, dashboards, deploy files, docs tables, then the goldens
    python -m rooflight.regen --check  # exit 1 naming each stale file; writes nothing (the goldens: the tests)

What it writes, each from the one declaration that owns it: rules/*.yaml (rules/generate.py), dashboards/json/
(dashboards/generate.py), the deploy files that embed them (deploy/generate.py), the docs' generated tables
(the metric catalogue and the client's in docs/metrics.md, the engines' coverage in docs/engines.md, the
detectors in docs/detectors.md and docs/metric-contract.md, the alert names there), and last the golden files
(tests/regen_goldens.py, which runs the tests that compare with them). A checkout tool: it writes into the
checkout it runs from, never into an installed package. After it: `git diff`, and commit what you can explain.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]  # agent/_root/regen.py -> the checkout


@dataclass(frozen=True)
class Block:
    """A generated table inside a hand-written document: the text between `begin` and `end`."""

    path: str
    begin: str
    end: str
    text: Callable[[], str]

    def render_into(self, doc: str) -> str:
        head, found, rest = doc.partition(self.begin)
        _, found_end, tail = rest.partition(self.end)
        if not found or not found_end:
            raise ValueError(f"{self.path}: lacks the markers {self.begin.strip()!r} ... {self.end.strip()!r}")
        return f"{head}{self.begin}{self.text()}{self.end}{tail}"


def _marker(name: str) -> tuple[str, str]:
    return f"<!-- generated: python -m rooflight.regen ({name}) -->\n", f"<!-- end generated ({name}) -->"


def _agent_table() -> str:
    from rooflight.agent.metrics.catalog import markdown_table

    return markdown_table()


def _client_table() -> str:
    from rooflight.agent.proxy.catalog import markdown_table

    return markdown_table()


def _board_titles() -> dict[str, str]:
    from rooflight.dashboards.generate import render_all

    return {name.removeprefix("rooflight-").removesuffix(".json"): json.loads(text)["title"].removeprefix("Rooflight / ")
            for name, text in render_all().items()}


def _detectors_table() -> str:
    """docs/detectors.md's table: each detector's key, series, alert and dashboard panel."""
    from rooflight.agent.signals.detectors import detectors

    titles = _board_titles()
    ruled = {d.alert for d in detectors() if d.rule is not None}
    rows = ["| key | gauge | alert | dashboard panel |", "|---|---|---|---|"]
    for d in detectors():
        more = ", ".join(f"`{s.metric}`" for s in d.exported()[1:])
        gauge = f"`{d.flag.metric}`" + (f" (+ {more})" if more else "")
        if d.rule is None and d.alert in ruled:
            alert = f"({d.alert}'s runbook)"
        else:
            alert = d.alert + (f" ({d.alert_note})" if d.alert_note else "")
        panel = f"{titles.get(d.panel.board, d.panel.board)}, {d.panel.title}" if d.panel else "-"
        rows.append(f"| `{d.key}` | {gauge} | {alert} | {panel} |")
    return "\n".join(rows) + "\n"


def _contract_detectors() -> str:
    """docs/metric-contract.md's detector gauges: each one's 0/1 series and the alert on-call gets."""
    from rooflight.agent.signals.detectors import detectors

    rows = ["| name | meaning | alert |", "|---|---|---|"]
    for d in detectors():
        rows.append(f"| `{d.flag.metric}` | {d.flag.help} | `{d.alert}` |")
    return "\n".join(rows) + "\n"


def _contract_alerts() -> str:
    """docs/metric-contract.md's alert names: the detectors', then the rules' own."""
    from rooflight.agent.metrics.names import RULE_ALERTS
    from rooflight.agent.signals.detectors import detectors

    own = list(dict.fromkeys(d.alert for d in detectors()))
    return (f"The detectors' (each as it declares it): {', '.join(f'`{a}`' for a in own)}.\n"
            f"The rules' own: {', '.join(f'`{a}`' for a in RULE_ALERTS if a not in own)}.\n")


def blocks() -> tuple[Block, ...]:
    return (
        Block("docs/metrics.md", "<!-- generated: python -m rooflight.agent.metrics.catalog -->\n",
              "<!-- end generated -->", _agent_table),
        Block("docs/metrics.md", "<!-- generated: python -m rooflight.agent.proxy.catalog -->\n",
              "<!-- end generated proxy -->", _client_table),
        Block("docs/detectors.md", *_marker("detectors"), _detectors_table),
        Block("docs/metric-contract.md", *_marker("detectors"), _contract_detectors),
        Block("docs/metric-contract.md", *_marker("alerts"), _contract_alerts),
    )


def docs() -> dict[Path, str]:
    """Each document with generated tables, as it should read."""
    from rooflight.collectors import coverage

    out: dict[Path, str] = {}
    engines = ROOT / "docs" / "engines.md"
    out[engines] = coverage.render_into(engines.read_text(encoding="utf-8"))
    for block in blocks():
        path = ROOT / block.path
        out[path] = block.render_into(out.get(path) or path.read_text(encoding="utf-8"))
    return out


def generated() -> dict[Path, str]:
    """Every generated file of the checkout but the goldens, and its text."""
    sys.path.insert(0, str(ROOT))  # deploy/ is the checkout's, not the package's
    from deploy.generate import outputs as deploy_outputs
    from rooflight.dashboards.generate import JSON_DIR, render_all
    from rooflight.rules.config import RulesConfig
    from rooflight.rules.generate import OUTPUTS, SPLIT_OUTPUTS, files
    from rooflight.rules.render import render

    config = RulesConfig()
    out = {path: render(config, fmt, scope) for path, fmt, scope in files(OUTPUTS, SPLIT_OUTPUTS)}
    out |= {JSON_DIR / name: text for name, text in render_all().items()}
    out |= deploy_outputs()  # after the dashboards: it embeds them (written in this order)
    out |= docs()
    return out


def stale() -> list[Path]:
    return sorted(p for p, text in generated().items() if not p.is_file() or p.read_text(encoding="utf-8") != text)


def write() -> list[Path]:
    """Write what changed, in order (the dashboards' JSON before the deploy files that copy it)."""
    written = []
    for _ in range(2):  # the deploy files embed the dashboards' JSON as written: a second pass settles them
        for path, text in generated().items():
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                written.append(path)
    return sorted(set(written))


def check_report(bad: list[Path], root: Path, command: str, fresh: str) -> int:
    """A --check's answer: each stale file named and 1, or `fresh` and 0 (this command's and deploy/generate.py's)."""
    for path in bad:
        print(f"stale: {path.relative_to(root)}", file=sys.stderr)
    if bad:
        print(f"run `{command}`, then read the diff", file=sys.stderr)
        return 1
    print(fresh)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rooflight.regen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail naming the stale files; write nothing")
    parser.add_argument("--no-goldens", action="store_true", help="leave the golden files alone")
    args = parser.parse_args(argv)
    if not (ROOT / "tests" / "regen_goldens.py").is_file():
        print(f"rooflight.regen: rooflight is imported from {ROOT}, not a checkout of the repository: install the "
              "checkout editable (`pip install -e .`, as .ci/install does) and run it with that environment's python",
              file=sys.stderr)
        return 2
    if args.check:
        return check_report(stale(), ROOT, "python -m rooflight.regen",
                            f"{len(generated())} generated files up to date (the goldens: the test suite compares them)")
    for path in write():
        print(f"written  {path.relative_to(ROOT)}")
    if args.no_goldens:
        return 0
    return subprocess.run([sys.executable, str(ROOT / "tests" / "regen_goldens.py")], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
