"""docs/metrics.md lists every client-side metric exactly as the proxy's catalog defines it."""

from __future__ import annotations

import subprocess
import sys

from support import ROOT

BEGIN = "<!-- generated: python -m rooflight.agent.proxy.catalog -->\n"
END = "<!-- end generated proxy -->"


def test_metrics_doc_has_the_proxy_table() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    documented = text.split(BEGIN, 1)[1].split(END, 1)[0]
    generated = subprocess.run([sys.executable, "-m", "rooflight.agent.proxy.catalog"], capture_output=True,
                               text=True, check=True, timeout=60).stdout
    assert documented.strip() == generated.strip(), "regenerate the proxy table: python -m rooflight.agent.proxy.catalog"
    assert "`rooflight_client_goodput_ratio`" in documented
