"""`rooflight plan` beside its peer, NVIDIA aiconfigurator, on the same model configs, GPUs, TP and load.

aiconfigurator (PyPI `aiconfigurator`) estimates a deployment from kernel timings measured on each GPU (its
per-operation tables for vLLM, TensorRT-LLM and SGLang); `plan` from the roofline of the step model
(agent/roofline/step.py) at stated efficiencies. For each case this prints, side by side:

- the prefill time of one prompt: plan at the compute roof and at --prefill-mfu 0.5 (what its pools assume),
  with its TP all-reduces; aiconfigurator's TTFT of one prompt alone (`estimate --estimate-mode static_ctx`);
- the decode step of a batch at a context: plan at the memory roof and at --decode-mbu 0.7 (its pools'),
  with its TP all-reduces; aiconfigurator's TPOT (`estimate --estimate-mode static_gen`);
- the GPUs a request rate needs at a p99 TTFT of 500 ms and a 50 ms ITL: plan's pools (split and shared)
  and aiconfigurator's fewest (`recommend`, aggregated and disaggregated).

aiconfigurator runs on CPU from its own venv (it pins numpy, pandas and pydantic; kept apart from the agent's):

    python3 -m venv /var/cache/rooflight/peers/aic-venv
    /var/cache/rooflight/peers/aic-venv/bin/pip install aiconfigurator==0.12.0
    .venv/bin/python bench/plan_peer.py --aiconfigurator /var/cache/rooflight/peers/aic-venv/bin/aiconfigurator

Each aiconfigurator call loads its tables (30-90 s on a shared 2-core machine); the whole run takes 20-40 min.
The model configs are the zoo's (tests/fixtures/model-configs/zoo), which are aiconfigurator's own copies:
both tools read the same numbers. docs/physics.md, section A peer for plan: aiconfigurator, has the table.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from rooflight.agent.model_files import load_config_json  # noqa: E402
from rooflight.agent.roofline.gpus import get_profile  # noqa: E402
from rooflight.agent.roofline.plan import build_plan, build_pool_plan, physics_capacities  # noqa: E402
from rooflight.agent.roofline.step import Decode, Layout, Roofs, Step  # noqa: E402

ZOO = ROOT / "tests" / "fixtures" / "model-configs" / "zoo"
PROMPT, OUTPUT, BATCH, TTFT, ITL = 2000, 250, 64, 0.5, 0.05


@dataclass(frozen=True)
class Case:
    name: str
    config: str  # the zoo file
    hf_id: str  # aiconfigurator's name for the same config
    gpu: str  # Rooflight's profile
    system: str  # aiconfigurator's
    tp: int
    rate: float  # requests/s for the pools
    backend: str = "vllm"


CASES = (
    Case("Llama-3.1-8B, dense", "Meta-Llama-3.1-8B.json", "meta-llama/Meta-Llama-3.1-8B", "h100-sxm", "h100_sxm", 1, 20),
    Case("Llama-3.1-70B, dense", "Meta-Llama-3.1-70B.json", "meta-llama/Meta-Llama-3.1-70B", "h100-sxm", "h100_sxm", 4, 5),
    Case("Llama-3.1-70B, dense", "Meta-Llama-3.1-70B.json", "meta-llama/Meta-Llama-3.1-70B", "h200", "h200_sxm", 8, 10),
    Case("Qwen3-30B-A3B, MoE", "Qwen3-30B-A3B.json", "Qwen/Qwen3-30B-A3B", "h100-sxm", "h100_sxm", 1, 20),
    Case("Qwen3-235B-A22B, MoE", "Qwen3-235B-A22B.json", "Qwen/Qwen3-235B-A22B", "h200", "h200_sxm", 8, 10),
    Case("DeepSeek-V3, MLA + MoE, fp8", "DeepSeek-V3.json", "deepseek-ai/DeepSeek-V3", "h200", "h200_sxm", 8, 10),
)


def plan_side(case: Case) -> dict[str, float]:
    model, gpu = load_config_json(ZOO / case.config), get_profile(case.gpu)
    prefill = build_plan(model, gpu, tp=case.tp, context_tokens=PROMPT, batch=1, prompt_tokens=PROMPT)
    decode = build_plan(model, gpu, tp=case.tp, context_tokens=PROMPT, batch=BATCH, prompt_tokens=1)
    layout = Layout(model, tp=case.tp)
    roofs = Roofs(decode.peak_flops, decode.peak_bandwidth_bytes_per_second, gpu.link).at(0.5, 0.7)
    at_70 = (layout.cost(Step(decode=Decode(BATCH, layout.layer_tokens(PROMPT)))).seconds(roofs)
             + decode.tp_allreduce_seconds_at_batch)
    p_cap, d_cap, batch, kv, step = physics_capacities(
        model, gpu, tp=case.tp, prompt_tokens=PROMPT, output_tokens=OUTPUT, batch_max=256, prefill_mfu=0.5,
        decode_mbu=0.7, reserved_bytes_per_gpu=4e9, itl_slo=ITL)
    pools = build_pool_plan(case.rate, PROMPT, OUTPUT, p_cap, d_cap, itl_slo=ITL, ttft_slo=TTFT, source="physics",
                            gpus_per_group=case.tp, decode_batch=batch, kv_bytes_per_request=kv,
                            decode_step_seconds=step)
    return {
        "prefill_roof_ms": (prefill.prefill_seconds_at_roof + prefill.prefill_tp_allreduce_seconds) * 1e3,
        "prefill_50_ms": (prefill.prefill_seconds + prefill.prefill_tp_allreduce_seconds) * 1e3,
        "decode_roof_ms": decode.decode_step_seconds_at_batch_with_tp * 1e3,
        "decode_70_ms": at_70 * 1e3,
        "gpus_split": (pools.prefill_groups + pools.decode_groups) * case.tp,
        "gpus_shared": pools.shared_groups * case.tp,
        "decode_batch": batch,
    }


def _aic(binary: str, *args: str, timeout: float = 3600) -> str:
    """aiconfigurator's answer (stdout and its log, where some versions print the tables), colours off."""
    run = subprocess.run([binary, "cli", *args, "--no-color"], capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"aiconfigurator {' '.join(args)} exited {run.returncode}: {run.stderr[-2000:]}")
    return run.stdout + "\n" + run.stderr


def _field(text: str, name: str) -> float:
    found = re.search(rf"^\s*{re.escape(name)}:\s+([\d,.]+)", text, re.M)
    if not found:
        raise RuntimeError(f"no {name} in aiconfigurator's answer:\n{text[-2000:]}")
    return float(found.group(1).replace(",", ""))


def _fewest_gpus(text: str, mode: str) -> int | None:
    """Rank 1's total GPUs in aiconfigurator's `<mode> Top Configurations` table (None without one)."""
    found = re.search(rf"(?:^|\n)\s*{mode} Top Configurations.*?\n(.*?)(?:\n\s*\n|\Z)", text, re.S)
    if not found:
        return None
    lines = [line for line in found.group(1).splitlines() if line.startswith("|")]
    header = next((line for line in lines if re.search(r"\|\s*Rank\s*\|", line)), None)
    row = next((line for line in lines if re.match(r"^\|\s+1\s+\|", line)), None)
    if header is None or row is None:
        return None
    columns = [c.strip() for c in header.strip("|").split("|")]
    column = next(i for i, c in enumerate(columns) if c.startswith("total_gpus"))
    return int([c.strip() for c in row.strip("|").split("|")][column].split()[0])


def aic_side(case: Case, binary: str) -> dict[str, float | None]:
    common = ["--model-path", case.hf_id, "--system", case.system, "--backend", case.backend]
    parallel = ["--tp-size", str(case.tp)]
    if load_config_json(ZOO / case.config).n_experts:  # experts split by TP as plan's (no expert parallelism)
        parallel += ["--moe-tp-size", str(case.tp), "--moe-ep-size", "1"]
    ctx = _aic(binary, "estimate", *common, *parallel, "--estimate-mode", "static_ctx", "--batch-size", "1",
               "--isl", str(PROMPT), "--osl", "2")
    gen = _aic(binary, "estimate", *common, *parallel, "--estimate-mode", "static_gen", "--batch-size", str(BATCH),
               "--isl", str(PROMPT), "--osl", "2")
    rec = _aic(binary, "recommend", *common, "--isl", str(PROMPT), "--osl", str(OUTPUT), "--ttft", str(TTFT * 1e3),
               "--tpot", str(ITL * 1e3), "--target-request-rate", str(case.rate))
    return {"prefill_ms": _field(ctx, "TTFT"), "decode_ms": _field(gen, "TPOT"),
            "gpus_agg": _fewest_gpus(rec, "agg"), "gpus_disagg": _fewest_gpus(rec, "disagg")}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiconfigurator", default="/var/cache/rooflight/peers/aic-venv/bin/aiconfigurator")
    ap.add_argument("--only", help="run the cases whose name or GPU contains this")
    ap.add_argument("--skip", type=int, default=0, help="skip the first N cases (resume a run)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for case in CASES[args.skip:]:
        if args.only and args.only not in f"{case.name} {case.gpu}":
            continue
        row = {"case": f"{case.name}, {case.tp} x {case.gpu}", "rate": case.rate, "plan": plan_side(case),
               "aiconfigurator": aic_side(case, args.aiconfigurator)}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"prefill of {PROMPT} tokens, decode step at batch {BATCH} and {PROMPT} tokens of context, GPUs for the "
          f"rate at {OUTPUT} output tokens (p99 TTFT {TTFT * 1e3:.0f} ms, ITL {ITL * 1e3:.0f} ms)")
    print("| case | prefill: plan roof / 50% | aic | decode step: plan roof / 70% | aic | GPUs at rate: plan split / "
          "shared | aic disagg / agg |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        p, a = r["plan"], r["aiconfigurator"]
        print(f"| {r['case']}, {r['rate']:g} req/s | {p['prefill_roof_ms']:.1f} / {p['prefill_50_ms']:.1f} ms | "
              f"{a['prefill_ms']:.1f} ms | {p['decode_roof_ms']:.2f} / {p['decode_70_ms']:.2f} ms | "
              f"{a['decode_ms']:.2f} ms | {p['gpus_split']} / {p['gpus_shared']} | {a['gpus_disagg']} / "
              f"{a['gpus_agg']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
