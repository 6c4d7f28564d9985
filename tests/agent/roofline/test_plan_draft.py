"""`rooflight plan --draft-model`: a speculative deployment planned on the step model's draft passes (the flags
`rooflight run` spells alike; k and the acceptance plan's own). Worked by hand from the configs: Llama-3-8B
(16,060,522,496 B of bf16 weights, its 1,050,673,152-byte input table read a row a token) with Llama-3.2-1B
(2,471,628,800 B, tied, read whole each pass), k = 4, 70% accepted, one H100 SXM (3.35 TB/s)."""

from __future__ import annotations

import json
import subprocess

import pytest

from support import run_in_process

DRAFT = ("--model", "llama-3-8b", "--draft-model", "llama-3.2-1b", "--num-speculative-tokens", "4",
         "--draft-acceptance", "0.7")


def plan(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_in_process("plan", *argv)


def test_the_decode_ceiling_counts_the_draft_passes_and_the_tokens_kept() -> None:
    # batch 1, weights only: the model for 5 verified tokens (16,060,522,496 - 1,050,673,152 + 5 x 8,192) and 4
    # draft passes (4 x 2,471,628,800): 24,896,405,504 B in 7.43 ms; 3.8 tokens kept: 511 tok/s (223 without)
    out = json.loads(plan(*DRAFT, "--json").stdout)
    step = (16_060_522_496 - 1_050_673_152 + 5 * 8192 + 4 * 2_471_628_800) / 3.35e12
    assert out["decode_step_seconds_weights_only"] == pytest.approx(step)
    assert out["decode_tokens_per_second_weights_only"] == pytest.approx(3.8 / step)
    assert round(out["decode_tokens_per_second_weights_only"]) == 511
    assert (out["draft_model"], out["num_speculative_tokens"], out["decode_tokens_per_step"]) == \
        ("llama-3.2-1b", 4, pytest.approx(3.8))
    # the draft's weights and KV take memory: 80 - 16.06 - 2.47 - 4 GB left; a 8,000-token sequence holds the
    # model's 131,072 B and the draft's 16 x 8 x 64 x 2 x 2 = 32,768 B a token
    assert out["kv_bytes_free_per_gpu"] == pytest.approx(80e9 - 16_060_522_496 - 2_471_628_800 - 4e9)
    assert out["kv_bytes_per_sequence_per_gpu"] == pytest.approx(8000 * (131_072 + 32_768))
    text = plan(*DRAFT).stdout
    assert "Speculative decoding: draft llama-3.2-1b, 4 tokens proposed a step" in text
    assert "decode ceiling          7.43 ms/step, 511 tok/s" in text


@pytest.mark.parametrize(("argv", "says"), [
    (("--model", "llama-3-8b", "--draft-model", "llama-3.2-1b"),
     "--draft-model needs --num-speculative-tokens and --draft-acceptance"),
    (("--model", "llama-3-8b", "--num-speculative-tokens", "4"), "give --draft-model (or --draft-model-config)"),
    ((*DRAFT[:-1], "1.5"), "--draft-acceptance 1.5: write the share of draft tokens accepted, from 0 to 1"),
    ((*DRAFT[:-3], "0", *DRAFT[-2:]), "--num-speculative-tokens 0: write the draft tokens a step, from 1 to 64"),
    (("--model", "llama-3-8b", "--draft-model", "no-such-model", "--num-speculative-tokens", "4",
      "--draft-acceptance", "0.7"), "--draft-model: unknown model preset"),
])
def test_a_draft_flag_without_its_partners_or_out_of_range_exits_2_naming_it(argv: tuple[str, ...], says: str) -> None:
    done = plan(*argv)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_itl_target_bounds_the_whole_verify_step_not_the_time_per_kept_token() -> None:
    # vLLM observes one ITL a verify step: at --itl-slo 0.02 the batch's step, 3.8 kept tokens' worth, is at most
    # 20 ms (was: batch 183, its steps ~76 ms, the 20 ms held against the time per kept token)
    done = plan("--model", "llama-3-70b", "--tp", "4", "--rate", "10", "--prompt", "2000", "--output", "250",
                "--itl-slo", "0.02", "--draft-model", "llama-3.2-1b", "--num-speculative-tokens", "4",
                "--draft-acceptance", "0.7", "--json")
    pools = json.loads(done.stdout)["pools"]
    verify_step = pools["decode_step_seconds"] * 3.8  # decode_step_seconds: a kept token's
    assert 0.015 < verify_step <= 0.02 and pools["decode_batch"] == 28
    assert "observes ITL once a verify step" in " ".join(plan("--help").stdout.split())


def test_draft_acceptance_is_accepted_over_proposed_as_the_live_agent_reads_it() -> None:
    # the live rooflight_spec_decode_acceptance_ratio is accepted / proposed draft tokens (signals/derive.py); a
    # per-position a = 0.7 at k = 4 is A = (0.7 + 0.49 + 0.343 + 0.2401) / 4 = 0.443: both keep 2.77 tokens a step
    a = (0.7 + 0.7 ** 2 + 0.7 ** 3 + 0.7 ** 4) / 4
    out = json.loads(plan(*DRAFT[:-1], f"{a}", "--json").stdout)
    assert out["decode_tokens_per_step"] == pytest.approx(1 + 0.7 + 0.49 + 0.343 + 0.2401)
    said = " ".join(plan("--help").stdout.split())
    assert "accepted / proposed draft tokens" in said and "A = (a + a^2 + ... + a^k) / k" in said


K4 = ("--num-speculative-tokens", "4", "--draft-acceptance", "0.7")


@pytest.mark.parametrize(("argv", "says"), [
    (("--model", "llama-3-8b", "--draft-model", "llama-3-70b", *K4),  # was accepted
     "--draft-model llama-3-70b: 70.6B params, no smaller than llama-3-8b's 8.03B"),
    (("--model", "qwen3-32b", "--draft-model", "llama-3-8b", *K4),
     "--draft-model llama-3-8b: a vocabulary of 128,256 tokens, qwen3-32b's 151,936"),
    (("--model", "llama-3.1-405b-fp8", "--tp", "8", "--context", "10000", "--draft-model", "llama-3-8b", *K4),
     "--draft-model llama-3-8b: --context 10,000: llama-3-8b reads at most 8,192"),
    (("--model", "llama-3.1-405b-fp8", "--tp", "8", "--rate", "1", "--prompt", "9000", "--output", "100",
      "--draft-model", "llama-3-8b", *K4), "--draft-model llama-3-8b: --prompt + --output 9,100: llama-3-8b reads"),
])
def test_a_draft_that_cannot_draft_for_the_model_exits_2_naming_it(argv: tuple[str, ...], says: str) -> None:
    done = plan(*argv)
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_a_draft_that_does_not_fit_beside_the_model_is_named() -> None:
    # Llama-3-70B in fp8 (72.7 GB a GPU) fits an H100 alone; its Llama-3-8B draft's 16.1 GB do not (was: "the
    # weights alone exceed this GPU's memory")
    text = plan("--model", "llama-3-70b", "--weight-dtype", "fp8", "--draft-model", "llama-3-8b", *K4).stdout
    assert "DOES NOT FIT            the draft's 16.1 GB (llama-3-8b) beside 72.7 GB of the model's weights" in text
    assert "weights alone" not in text


def test_the_kv_lines_add_up_with_the_drafts_kv() -> None:
    # 8,000 x (131,072 + 32,768) B = 1.31 GB a sequence: was printed beside "131,072 B" a token alone
    text = plan(*DRAFT).stdout
    assert "KV cache per token      131,072 B (128 KiB), all layers (+ 32,768 B of the draft's)" in text
    assert "KV cache per sequence   1.31 GB at 8,000 tokens, incl. the draft's" in text
    assert json.loads(plan(*DRAFT, "--json").stdout)["draft_kv_bytes_per_token"] == 32_768
