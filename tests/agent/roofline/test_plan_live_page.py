"""`rooflight plan --from-live` judges the page's figures before it sizes on them: a capacity, a mix, a GPU and a
batch the page gives are checked, and a figure the page gave is never reported as a flag the user never typed
(pages served by support.FakeEngine over 127.0.0.1; `rooflight plan` run as a user runs it)."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from support import plan_from_live, rooflight_exe

S = 'target="t",engine="vllm",model="m",rank="0",window="1m"'


def page(*, rps: float = 4, prefill_tokens: float = 8000, decode_tokens: float = 1000, role: str = "both",
         capacities: dict[str, str] | None = None, batch: str | None = "64", source: str | None = None,
         gpus: tuple[str, ...] = ()) -> str:
    """An agent's page: one target's traffic (2,000 prompt + 250 output tokens a request at the defaults), its
    one-phase capacities, its batch at the first wall, its model's preset and its GPUs' profiles."""
    caps = {"prefill": "20000", "decode": "3000"} if capacities is None else capacities
    lines = [f"rooflight_requests_per_second{{{S}}} {rps}",
             f'rooflight_tokens_per_second{{{S},phase="prefill"}} {prefill_tokens}',
             f'rooflight_tokens_per_second{{{S},phase="decode"}} {decode_tokens}',
             f'rooflight_saturation_ratio{{{S},role="{role}"}} 0.5',
             *(f'rooflight_capacity_phase_tokens_per_second{{{S},phase="{p}"}} {v}' for p, v in caps.items())]
    if batch is not None:
        lines.append(f"rooflight_capacity_decode_batch_requests{{{S}}} {batch}")
    if source is not None:
        lines.append(f'rooflight_model_info{{target="t",model="m",spec="{source.split(":")[-1]}",'
                     f'config_source="{source}",weight_dtype="bf16",kv_dtype="bf16"}} 1')
    for i, profile in enumerate(gpus):
        lines += [f'rooflight_gpu_info{{gpu="{i}",name="n",profile="{profile}",reason="",source="nvml",'
                  f'uuid="GPU-{i}"}} 1',
                  f'rooflight_target_gpu_info{{target="t",gpu="{i}",uuid="GPU-{i}",rule="nvml_pids"}} 1']
    return "\n".join(lines) + "\n"


def pools(done: subprocess.CompletedProcess[str]) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["pools"]


@pytest.mark.parametrize("decode", ["0", "-3000", "0.5", "1e300"])
async def test_an_unusable_live_decode_capacity_exits_2_saying_it_is_the_pages(decode: str) -> None:
    # was: ZeroDivisionError (0), "decode capacity must be a number above 0, got -3000.0" (negative: a flag the
    # user never gave), and 1e300 sized pools "1.25e-295% busy"
    done = await plan_from_live(page(capacities={"prefill": "20000", "decode": decode}), "--rate", "10")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"exports a decode capacity of {float(decode):g} tokens/s" in done.stderr
    assert "unusable" in done.stderr and "give --decode-capacity" in done.stderr
    # --decode-capacity replaces it
    assert pools(await plan_from_live(page(capacities={"prefill": "20000", "decode": decode}), "--rate", "10",
                               "--decode-capacity", "2500", "--json"))["decode_capacity_per_group"] == 2500


async def test_a_live_mix_past_the_models_context_is_said_to_be_the_pages() -> None:
    # 8,700 prompt + 4,400 output tokens a request (the demo's kv-wall window) on llama-3-8b's 8,192: was
    # "--prompt + --output 13,100: llama-3-8b reads at most 8,192", flags the user never gave
    body = page(rps=1, prefill_tokens=8700, decode_tokens=4400, role="prefill", capacities={"prefill": "20000"},
                source="preset:llama-3-8b")
    done = await plan_from_live(body, "--rate", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "serves 8,700 prompt + 4,400 output tokens a request (the live mix), 13,100 in all, past the 8,192 " \
           "llama-3-8b reads" in done.stderr and "--prompt and --output" in done.stderr
    assert "--prompt + --output 13,100" not in done.stderr
    # the flags override it
    assert pools(await plan_from_live(body, "--rate", "1", "--prompt", "2000", "--output", "250", "--json"))["prompt_tokens"] \
        == 2000


@pytest.mark.parametrize(("rps", "tokens"), [("1e-300", "1e300"), ("1", "1e10")])
async def test_a_live_mix_no_engine_serves_is_a_bad_page(rps: str, tokens: str) -> None:
    # was: "--prompt + --output inf"
    done = await plan_from_live(page(rps=float(rps), prefill_tokens=float(tokens), decode_tokens=float(tokens)), "--rate", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "not a mix any engine serves" in done.stderr and "give --prompt and --output" in done.stderr
    assert "inf" not in done.stderr


async def test_a_live_batch_whose_step_is_past_the_itl_target_is_noted() -> None:
    # 256 sequences at 3,000 tok/s step every 85.3 ms, past the 50 ms target: was said nowhere (the header still
    # read "ITL 50 ms")
    done = await plan_from_live(page(batch="256"), "--rate", "10", "--json")
    notes = pools(done)["notes"]
    assert any("decode batch of 256 at its first wall steps every 85.3 ms a decoded token, past the 50 ms ITL "
               "target" in n for n in notes), notes
    text = (await plan_from_live(page(batch="256"), "--rate", "10")).stdout
    assert "Note: the live agent (t, role both)'s decode batch of 256" in text
    # 64 at 3,000 tok/s (21.3 ms) is within it: no note
    assert not any("ITL target" in n for n in pools(await plan_from_live(page(batch="64"), "--rate", "10", "--json"))["notes"])


ROOFLINE_ONLY = [("--gpu", "h200"), ("--output-cv", "0.8"), ("--draft-model", "llama-3.2-1b"),
                 ("--draft-model", "llama-3.2-1b", "--num-speculative-tokens", "4", "--draft-acceptance", "0.7")]


@pytest.mark.parametrize("flags", ROOFLINE_ONLY)
async def test_roofline_flags_where_no_capacity_is_the_rooflines_exit_2(flags: tuple[str, ...]) -> None:
    # were ignored without a word: both capacities from the page, from the flags, or no --rate at all (and a
    # --draft-model missing its --num-speculative-tokens was not even checked)
    done = await plan_from_live(page(), "--rate", "10", *flags)
    assert done.returncode == 2 and "no capacity here is the roofline's: both capacities are the live agent's" \
        in done.stderr, done.stderr
    assert flags[0] in done.stderr and "drop" in done.stderr
    done = await asyncio.to_thread(subprocess.run, [
        rooflight_exe(), "plan", "--rate", "10", "--prompt", "1000", "--output", "200", "--prefill-capacity", "10000",
        "--decode-capacity", "2500", *flags], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "both capacities are given" in done.stderr
    done = await plan_from_live(page(), *flags)
    assert done.returncode == 2 and "--from-live without --rate reads the live signals alone" in done.stderr
    # where a phase is the roofline's they apply
    assert (await plan_from_live(page(capacities={"decode": "3000"}, source="preset:llama-3-8b", gpus=("h100-sxm",)),
                          "--rate", "10", "--gpu", "h200", "--output-cv", "0.8")).returncode == 0
