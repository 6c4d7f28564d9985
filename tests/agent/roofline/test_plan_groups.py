"""`rooflight plan --rate`'s groups: an EP group's GPUs and capacity, a disaggregated live agent's one phase,
and the live agent's TP (pages served over 127.0.0.1)."""

from __future__ import annotations

import argparse
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from rooflight.agent.errors import ConfigError
from rooflight.agent.plan_cli import register
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.roofline.models import preset
from rooflight.agent.roofline.plan import physics_capacities
from support import MODEL_CONFIGS


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="rooflight")
    register(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["plan", *argv, "--json"])
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


def _text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    ap = argparse.ArgumentParser(prog="rooflight")
    register(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["plan", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(page: str) -> str:
        body = page.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield start
    for httpd in servers:
        httpd.shutdown()


def _page(role: str, phases: dict[str, float], *, tp: int | None = None, source: str | None = None) -> str:
    s = 'target="t",engine="vllm",model="m",rank="0",window="1m"'
    lines = [f'rooflight_requests_per_second{{{s}}} 4',
             f'rooflight_tokens_per_second{{{s},phase="prefill"}} 8000',  # 2,000 prompt + 250 output a request
             f'rooflight_tokens_per_second{{{s},phase="decode"}} 1000',
             f'rooflight_saturation_ratio{{{s},role="{role}"}} 0.5',
             *(f'rooflight_capacity_phase_tokens_per_second{{{s},phase="{p}"}} {v}' for p, v in phases.items())]
    if "decode" in phases:
        lines.append(f'rooflight_capacity_decode_batch_requests{{{s}}} 64')  # the batch at its first wall
    if tp is not None:
        lines.append(f'rooflight_tensor_parallel_size{{target="t",model="m"}} {tp}')
    if source is not None:
        lines.append(f'rooflight_model_info{{target="t",model="m",spec="{source.split(":")[-1]}",'
                     f'config_source="{source}",weight_dtype="bf16",kv_dtype="bf16"}} 1')
    return "\n".join(lines) + "\n"


# --- 1. a group is the GPUs one copy spans: max(tp, ep), an EP group's capacity all its ranks' ---

def test_an_ep_group_is_max_tp_ep_gpus_and_carries_all_its_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    # DeepSeek-V3 (673 GB) at TP1 with its experts over 8 H200s: one copy is 8 GPUs (before: "per group (1 GPU)",
    # a shared pool of 2 groups, 2 GPUs for a model whose experts span 8)
    d = _plan(capsys, "--model-config", str(MODEL_CONFIGS / "zoo" / "DeepSeek-V3.json"), "--gpu", "h200", "--tp", "1",
              "--ep", "8", "--rate", "3", "--prompt", "1900", "--output", "200")["pools"]
    assert d["gpus_per_group"] == 8 and d["ranks_per_group"] == 8
    assert d["shared_groups"] == 1 and d["share"] is True
    # the group's capacities are its 8 ranks' (the step model's per-rank figures assume every rank runs)
    from rooflight.agent.model_files import resolve_model
    model = resolve_model(None, str(MODEL_CONFIGS / "zoo" / "DeepSeek-V3.json"), None, None)
    p, dcap, batch, _, step = physics_capacities(model, get_profile("h200"), tp=1, prompt_tokens=1900,
                                                 output_tokens=200, batch_max=256, prefill_mfu=0.5, decode_mbu=0.7,
                                                 reserved_bytes_per_gpu=4e9, itl_slo=0.05, ep=8)
    assert batch == 8 * 256 and dcap == pytest.approx(batch / step) and d["decode_capacity_per_group"] == dcap
    # one prompt still prefills on one rank: the TTFT queue's service time is one rank's
    assert d["prefill_seconds_per_prompt"] == pytest.approx(1900 * 8 / p)
    # TP2 x EP8: 4 ranks of 2 GPUs
    d = _plan(capsys, "--model", "deepseek-v3", "--gpu", "h200", "--tp", "2", "--ep", "8", "--rate", "3",
              "--prompt", "1900", "--output", "200")["pools"]
    assert (d["gpus_per_group"], d["ranks_per_group"]) == (8, 4)


# --- 2. a disaggregated live agent: its own phase's capacity, the other from its model or the flags ---

def test_a_decode_agent_gives_its_decode_capacity_and_its_models_prefill(capsys: pytest.CaptureFixture[str],
                                                                         serve: Any) -> None:
    url = serve(_page("decode", {"decode": 3000.0}, source="preset:ref-8b"))
    # the page has traffic: its mix (2,000 + 250) needs no --prompt/--output (before: "--rate needs ... or
    # --from-live with traffic")
    out = _plan(capsys, "--from-live", url, "--rate", "10", "--gpu", "h100-sxm")
    d = out["pools"]
    assert (d["prompt_tokens"], d["output_tokens"]) == (2000, 250)
    assert d["decode_capacity_per_group"] == 3000 and d["capacity_source"] == "prefill physics, decode live"
    p, *_ = physics_capacities(preset("ref-8b"), get_profile("h100-sxm"), tp=1, prompt_tokens=2000, output_tokens=250,
                               batch_max=256, prefill_mfu=0.5, decode_mbu=0.7, reserved_bytes_per_gpu=4e9,
                               itl_slo=0.05)
    assert d["prefill_capacity_per_group"] == pytest.approx(p)
    assert any("prefill capacity: the roofline of ref-8b, the live agent's model" in n for n in d["notes"])
    text = _text(capsys, "--from-live", url, "--rate", "10")
    assert "prefill the roofline of the model on its GPUs; decode the live agent" in text


def test_a_prefill_agent_whose_model_is_not_on_the_page_exits_2_naming_the_flag(
        capsys: pytest.CaptureFixture[str], serve: Any) -> None:
    url = serve(_page("prefill", {"prefill": 20000.0}, source="config.json:/srv/model/config.json"))
    # before: the decode capacity of ref-8b, a model nobody named, silently
    with pytest.raises(ConfigError, match=r"no decode capacity: t \(role prefill\) exports prefill capacity only"
                                          r".*give --decode-capacity"):
        _plan(capsys, "--from-live", url, "--rate", "10")
    d = _plan(capsys, "--from-live", url, "--rate", "10", "--decode-capacity", "2500")["pools"]
    assert d["prefill_capacity_per_group"] == 20000 and d["decode_capacity_per_group"] == 2500
    assert d["capacity_source"] == "prefill live, decode flags"


# --- 3. the live agent's TP is the group's ---

def test_the_live_agents_tp_sizes_the_group(capsys: pytest.CaptureFixture[str], serve: Any) -> None:
    url = serve(_page("both", {"prefill": 20000.0, "decode": 3000.0}, tp=4))
    d = _plan(capsys, "--from-live", url, "--rate", "10")
    assert d["live"][0]["tensor_parallel_size"] == 4
    assert d["pools"]["gpus_per_group"] == 4 and d["pools"]["notes"] == []  # before: 1
    assert "per group (4 GPUs)" in _text(capsys, "--from-live", url, "--rate", "10")
    d = _plan(capsys, "--from-live", url, "--rate", "10", "--tp", "2")["pools"]
    assert d["gpus_per_group"] == 2
    assert any("--tp 2 as given" in n and "spans 4 GPUs" in n for n in d["notes"])


# --- 4. a live decode capacity's slots are the batch at the agent's first wall ---

@pytest.mark.parametrize("batch", [None, "0", "1e300", "NaN", "-5", "+Inf", "0.5"])
def test_without_a_readable_live_batch_the_slots_are_capacity_x_itl_with_a_note(
        capsys: pytest.CaptureFixture[str], serve: Any, batch: str | None) -> None:
    page = "".join(line + "\n" for line in _page("both", {"prefill": 20000.0, "decode": 3000.0}).splitlines()
                   if "decode_batch" not in line)
    if batch is not None:  # a hostile page's batch: not read
        page += f'rooflight_capacity_decode_batch_requests{{target="t",engine="vllm",model="m",rank="0",window="1m"}} {batch}\n'
    d = _plan(capsys, "--from-live", serve(page), "--rate", "10")["pools"]
    assert d["decode_slots_per_group"] == pytest.approx(3000.0 * 0.05) and d["decode_batch"] is None
    said = ("exports no rooflight_capacity_decode_batch_requests" if batch is None else
            f"exports an invalid rooflight_capacity_decode_batch_requests ({float(batch):g}: not a batch of 1 to")
    assert any(said in n for n in d["notes"]), d["notes"]  # was "exports no" for an invalid one too


def test_a_fractional_live_batch_reads_alike_in_both_lines(capsys: pytest.CaptureFixture[str], serve: Any) -> None:
    page = _page("both", {"prefill": 20000.0, "decode": 3000.0}).replace("decode_batch_requests{" , "X{")
    page += 'rooflight_capacity_decode_batch_requests{target="t",engine="vllm",model="m",rank="0",window="1m"} 1.5\n'
    text = _text(capsys, "--from-live", serve(page), "--rate", "10")
    assert "decode batch 1.5)" in text and "its 1.5 slots a group" in text  # was "decode batch 2"


def test_the_live_batch_and_its_step_are_the_decode_slots(capsys: pytest.CaptureFixture[str], serve: Any) -> None:
    d = _plan(capsys, "--from-live", serve(_page("both", {"prefill": 20000.0, "decode": 3000.0})), "--rate", "10")
    # 64 sequences at 3,000 tok/s: each steps every 64 / 3,000 = 21.3 ms
    assert d["pools"]["decode_slots_per_group"] == 64 and d["pools"]["decode_step_seconds"] == pytest.approx(64 / 3000)


# --- 5. the physics of a phase the page lacks runs on the page's GPU ---

def _gpus(*rows: tuple[str, str, bool]) -> str:
    """(uuid, profile, the target's?) rows of rooflight_gpu_info and rooflight_target_gpu_info."""
    return "".join(f'rooflight_gpu_info{{gpu="{i}",name="n",profile="{profile}",reason="",source="nvml",'
                   f'uuid="{uuid}"}} 1\n' + (f'rooflight_target_gpu_info{{target="t",gpu="{i}",uuid="{uuid}",'
                                             f'rule="nvml_pids"}} 1\n' if mine else "")
                   for i, (uuid, profile, mine) in enumerate(rows))


def test_a_missing_phase_is_sized_on_the_pages_gpu(capsys: pytest.CaptureFixture[str], serve: Any) -> None:
    # a decode agent on an H200 (the node also has an L40S another engine uses): its prefill on the H200's
    # 989 TFLOP/s at 50% MFU, the H200's own; before, on --gpu's default h100-sxm without a word
    url = serve(_page("decode", {"decode": 3000.0}, source="preset:ref-8b")
                + _gpus(("GPU-a", "h200", True), ("GPU-b", "l40s", False)))
    d = _plan(capsys, "--from-live", url, "--rate", "10")["pools"]
    p, *_ = physics_capacities(preset("ref-8b"), get_profile("h200"), tp=1, prompt_tokens=2000, output_tokens=250,
                               batch_max=256, prefill_mfu=0.5, decode_mbu=0.7, reserved_bytes_per_gpu=4e9,
                               itl_slo=0.05)
    assert d["prefill_capacity_per_group"] == pytest.approx(p)
    assert any("on 1 x h200 (the live agent's GPU, rooflight_gpu_info)" in n for n in d["notes"]), d["notes"]
    # --gpu as given wins, and the plan says the page's differs
    d = _plan(capsys, "--from-live", url, "--rate", "10", "--gpu", "l40s")["pools"]
    assert any("--gpu l40s as given" in n and "runs on h200" in n for n in d["notes"])
    # a page with no rooflight_gpu_info: the default, said
    url = serve(_page("decode", {"decode": 3000.0}, source="preset:ref-8b"))
    d = _plan(capsys, "--from-live", url, "--rate", "10")["pools"]
    assert any("on 1 x h100-sxm (the default --gpu: the page names no GPU profile)" in n for n in d["notes"])


@pytest.mark.parametrize(("gpus", "says"), [
    ((("GPU-a", "h200", False), ("GPU-b", "l40s", False)), "GPUs of different profiles (h200, l40s"),
    ((("GPU-a", "h200", True), ("GPU-b", "l40s", True)), "GPUs of different profiles (h200, l40s"),
    ((("GPU-a", "unknown", True),), "a GPU profile plan does not know (unknown"),
    ((("GPU-a", "tpu-v9", True),), "a GPU profile plan does not know (tpu-v9"),
])
def test_an_unknown_or_mixed_live_gpu_asks_for_gpu(capsys: pytest.CaptureFixture[str], serve: Any,
                                                    gpus: tuple[tuple[str, str, bool], ...], says: str) -> None:
    # was: sized on h100-sxm's peaks, "(the default --gpu: the page names no GPU profile)"
    url = serve(_page("decode", {"decode": 3000.0}, source="preset:ref-8b") + _gpus(*gpus))
    with pytest.raises(ConfigError, match=re.escape(says) + r".*give --gpu"):
        _plan(capsys, "--from-live", url, "--rate", "10")
    d = _plan(capsys, "--from-live", url, "--rate", "10", "--gpu", "h200")["pools"]
    assert any("on 1 x h200 (--gpu)" in n for n in d["notes"])
