"""`rooflight plan`'s messages say what happened: a page that is not an agent's is not "no signals yet", a
hostile negative request rate is no traffic (not a --prompt the user never gave), a page of several targets
names the one the pools read, and pools from two given capacities print no calculator of a model nobody
named."""

from __future__ import annotations

import pytest

from support import MODEL_CONFIGS, plan_from_live, run_in_process

SAMPLES = MODEL_CONFIGS.parent / "engine-samples"
S = 'target="{t}",engine="vllm",model="m",rank="0",window="1m"'


def _series(target: str, requests: float, prefill: float, decode: float) -> str:
    s = S.format(t=target)
    return "".join(f"{line}\n" for line in (
        f"rooflight_requests_per_second{{{s}}} {requests}",
        f'rooflight_tokens_per_second{{{s},phase="prefill"}} 8000',
        f'rooflight_tokens_per_second{{{s},phase="decode"}} 1000',
        f'rooflight_capacity_phase_tokens_per_second{{{s},phase="prefill"}} {prefill}',
        f'rooflight_capacity_phase_tokens_per_second{{{s},phase="decode"}} {decode}',
        f"rooflight_capacity_decode_batch_requests{{{s}}} 64"))


async def test_an_engines_own_page_is_not_an_agents() -> None:
    page = (SAMPLES / "vllm-cpu-load-c16.prom").read_text()
    done = await plan_from_live(page)
    assert done.returncode == 2, done.stdout  # was: "The agent serves no windowed signals yet", exit 0
    assert "not a Rooflight agent's /metrics" in done.stderr and "9746" in done.stderr
    # an agent with no windows yet still says so: its build_info is on the page
    done = await plan_from_live('rooflight_build_info{version="0.2.0"} 1\n')
    assert done.returncode == 0 and "no windowed signals yet" in done.stdout


async def test_a_negative_live_request_rate_is_no_traffic_not_a_bad_prompt() -> None:
    done = await plan_from_live(_series("t", -4, 20000, 3000), "--rate", "10")
    assert done.returncode == 2
    assert "has no traffic in its window" in done.stderr  # was: "--prompt must be a number above 0, got -2000.0"
    assert "got -" not in done.stderr


async def test_the_pools_name_the_target_they_read_among_several() -> None:
    done = await plan_from_live(_series("t", 4, 20000, 3000) + _series("u", 2, 40000, 6000), "--rate", "10")
    assert done.returncode == 0, done.stderr
    assert "per group (1 GPU): 20,000 prefill tok/s, 3,000 decode tok/s" in done.stdout  # t's
    assert "Note: the page has other targets too (u): the pools read t alone" in done.stdout


def test_two_given_capacities_print_the_pools_alone() -> None:
    done = run_in_process("plan", "--rate", "10", "--prompt", "1000", "--output", "200",
                          "--prefill-capacity", "10000", "--decode-capacity", "2500")
    assert done.returncode == 0 and done.stdout.startswith("Pools for 10 req/s")  # was: ref-8b's calculator first
    assert "ref-8b" not in done.stdout
    one = run_in_process("plan", "--rate", "10", "--prompt", "1000", "--output", "200", "--decode-capacity", "2500")
    assert one.stdout.startswith("ref-8b on 1 x h100-sxm")  # the prefill capacity is its roofline's: shown


@pytest.mark.parametrize(("argv", "says"), [
    (("--reserved-gb", "70"), "the 70 GB reserved (--reserved-gb) leaves no memory for the KV cache beside 16 GB"),
    (("--rate", "10", "--prompt", "inf", "--output", "200"), "--prompt inf: not a number"),
    (("--rate", "10", "--prompt", "1000", "--output", "200", "--prefill-capacity", "1e308"),
     "--prefill-capacity 1e+308: write prefill tokens/s one group carries"),
])
def test_the_other_reviewed_messages_say_what_to_fix(argv: tuple[str, ...], says: str) -> None:
    done = run_in_process("plan", *argv)
    assert says in done.stdout + done.stderr
    assert "raise --tp" not in done.stderr and "weights alone exceed" not in done.stdout


K4 = ("--num-speculative-tokens", "4", "--draft-acceptance", "0.7")


@pytest.mark.parametrize(("argv", "says", "not_said"), [
    (("--model", "llama-3-8b", "--draft-model-config", "/nonexist.json", *K4),
     "--draft-model-config: cannot read model config /nonexist.json", "--draft-model:"),
    (("--model", "llama-3-8b", "--draft-model", "", *K4), "--draft-model is empty", "give --draft-model"),
    (("--model", "llama-3-8b", "--draft-model", "llama-3.2-1b", "--num-speculative-tokens", "4"),
     "--draft-model needs --draft-acceptance: the share of its proposed tokens the model accepts",
     "tokens it proposes a step"),
    (("--model", "meta-llama/Llama-3.1-8B", "--context", "131073"),
     "--context 131,073: meta-llama/Llama-3.1-8B (llama-3-8b) reads at most 131,072", "llama-3-8b reads"),
])
def test_draft_and_context_messages_name_what_the_user_gave(argv: tuple[str, ...], says: str, not_said: str) -> None:
    done = run_in_process("plan", *argv)
    assert done.returncode == 2 and says in done.stderr and not_said not in done.stderr, done.stderr


def test_large_counts_of_groups_keep_their_thousands_separators() -> None:
    done = run_in_process("plan", "--rate", "20000", "--prompt", "2000", "--output", "250",
                          "--prefill-capacity", "100000", "--decode-capacity", "2500")
    assert "decode pool             2,010 groups" in done.stdout and "2,000 at 100%)" in done.stdout  # was "2010 groups"
    assert "Verdict: share one pool of 2,401 groups" in done.stdout
