"""The fleet's cost records at edges of rules/capacity.py nothing else guards,
replayed through the shipped rules/rooflight.rules.yaml with promtool; each value worked by hand."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from support import ROOT

RULES = ROOT / "rules" / "rooflight.rules.yaml"
MODEL = "llama-70b"


def _pod(cluster: str, pod: str, *, decode_per_15s: int, price: float | None, share: float | None,
         tp: int = 1) -> dict[str, str]:
    """One decode pod's agent series, sampled every 15 s for 15 minutes."""
    rank = f'cluster="{cluster}", namespace="llm", pod="{pod}", job="rooflight", target="{pod}", engine="vllm", ' \
           f'model="{MODEL}", rank="0"'
    target = f'cluster="{cluster}", namespace="llm", pod="{pod}", job="rooflight", target="{pod}"'
    s = {f"rooflight_prompt_tokens_total{{{rank}}}": "0+0x60",
         f"rooflight_generation_tokens_total{{{rank}}}": f"0+{decode_per_15s}x60",
         f'rooflight_tensor_parallel_size{{{target}, model="{MODEL}"}}': f"{tp}x60"}
    if price is not None:
        s[f"rooflight_gpu_hour_cost{{{target}}}"] = f"{price}x60"
    if share is not None:
        s[f'rooflight_gpu_time_share_ratio{{{rank}, phase="decode", window="5m"}}'] = f"{share}x60"
    return s


def _promtool(series: dict[str, str], checks: list[tuple[str, list[tuple[str, float]]]], tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool not installed")
    test = {"rule_files": [str(RULES)], "evaluation_interval": "15s",
            "tests": [{"interval": "15s",
                       "input_series": [{"series": k, "values": v} for k, v in series.items()],
                       "promql_expr_test": [{"expr": expr, "eval_time": "10m",
                                             "exp_samples": [{"labels": lab, "value": val} for lab, val in want]}
                                            for expr, want in checks]}]}
    path = tmp_path / "cost_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, f"{run.stdout}{run.stderr}"


@pytest.mark.prometheus
def test_a_priced_rank_without_a_gpu_time_share_lowers_nobodys_price(tmp_path: Path) -> None:
    # prod: two decode pods at 2.5 per GPU-hour (TP 1), 100 tokens/s each (1,500 per 15 s); llm-b exports no
    # GPU-time share (an older agent). Decode's bill is llm-a's 2.5 x 1 per hour over its 100/s = 0.36M/h:
    # 6.9444 per million. Counting llm-b's tokens without its bill would halve it (3.4722).
    series = _pod("prod", "llm-a", decode_per_15s=1500, price=2.5, share=1.0) | \
        _pod("prod", "llm-b", decode_per_15s=1500, price=2.5, share=None)
    _promtool(series, [("round(model_phase:rooflight_cost_per_million_tokens:rate5m, 0.0001)",
                        [(f'{{cluster="prod", namespace="llm", job="rooflight", model="{MODEL}", phase="decode"}}',
                          6.9444)])], tmp_path)


@pytest.mark.prometheus
def test_the_fleets_gpu_hour_cost_stays_within_each_cluster(tmp_path: Path) -> None:
    # prod: two pods of TP 4 at 2.5 per GPU-hour = 2 x 10 = 20 per hour; staging: one of TP 1 at 2.0 = 2.
    # Summed over clusters they would read 22 for each.
    series = _pod("prod", "llm-a", decode_per_15s=1500, price=2.5, share=1.0, tp=4) | \
        _pod("prod", "llm-b", decode_per_15s=1500, price=2.5, share=1.0, tp=4) | \
        _pod("staging", "llm-s", decode_per_15s=150, price=2.0, share=1.0)
    _promtool(series, [("model:rooflight_gpu_hour_cost:sum",
                        [(f'model:rooflight_gpu_hour_cost:sum{{cluster="prod", namespace="llm", job="rooflight", '
                          f'model="{MODEL}"}}', 20),
                         (f'model:rooflight_gpu_hour_cost:sum{{cluster="staging", namespace="llm", job="rooflight", '
                          f'model="{MODEL}"}}', 2)])], tmp_path)
