"""`rooflight plan` says when its batch or context is past the KV wall, and what the wall allows; it refuses a
context longer than the model reads (max_position_embeddings), naming the flag.

Worked by hand: Llama-3-70B (config.json: 80 layers, 8 KV heads of 128, bf16; 70,553,706,496 parameters) on
4 x H100 SXM (80 GB each): weights 141.1 GB / 4 = 35.28 GB a GPU, 4 GB reserved, 40.72 GB left for KV. A token
holds 80 x 8 x 128 x 2 (K, V) x 2 B = 327,680 B, a GPU a quarter of it: 81,920 B, so a sequence of 8,000 tokens
takes 655.4 MB a GPU and 40.72 GB hold 62 of them; batch 128 needs 83.9 GB a GPU."""

from __future__ import annotations

import json
import subprocess

import pytest

from rooflight.agent.roofline.models import PRESETS, preset_for_hf_id
from support import ROOT, run_in_process

PARAMS_70B = 70_553_706_496
WEIGHTS_PER_GPU = PARAMS_70B * 2 / 4
SEQUENCE_PER_GPU = 80 * 8 * 128 * 2 * 2 / 4 * 8000
WALL = int((80e9 - WEIGHTS_PER_GPU - 4e9) // SEQUENCE_PER_GPU)


def plan(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_in_process("plan", *argv)


def test_the_worked_wall_is_62_sequences() -> None:
    assert WALL == 62 and SEQUENCE_PER_GPU == pytest.approx(655.36e6)


def test_a_batch_past_the_kv_wall_is_said_in_text_and_json() -> None:
    text = plan("--model", "llama-3-70b", "--tp", "4", "--batch", "128")
    assert text.returncode == 0, text.stderr
    assert f"max concurrent seqs     {WALL} at 8,000 tokens each" in text.stdout
    assert (f"BEYOND THE KV WALL      128 sequences of 8,000 tokens need {128 * SEQUENCE_PER_GPU / 1e9:.1f} GB of KV"
            f" per GPU, 40.7 GB left: an engine runs at most {WALL} at once") in text.stdout
    out = json.loads(plan("--model", "llama-3-70b", "--tp", "4", "--batch", "128", "--json").stdout)
    assert out["batch_within_kv_wall"] is False and out["max_concurrent_sequences"] == WALL
    assert out["kv_bytes_per_sequence_per_gpu"] == pytest.approx(SEQUENCE_PER_GPU)
    # at the wall itself the figures are an engine's: no warning
    at_wall = plan("--model", "llama-3-70b", "--tp", "4", "--batch", str(WALL))
    assert "BEYOND THE KV WALL" not in at_wall.stdout
    assert json.loads(plan("--model", "llama-3-70b", "--tp", "4", "--batch", str(WALL), "--json").stdout)[
        "batch_within_kv_wall"] is True


def test_a_context_no_sequence_fits_is_said_not_printed_as_the_batch_the_wall_allows() -> None:
    done = plan("--model", "ref-8b", "--context", "1000000")  # the reference shape: no context bound of its own
    assert done.returncode == 0, done.stderr
    assert "the batch the KV wall allows" not in done.stdout
    # 1e6 tokens x 131,072 B = 131 GB, past the 80 - 16 - 4 = 60 GB an H100 has left
    assert "NO SEQUENCE FITS        one sequence of 1,000,000 tokens holds 131 GB of KV per GPU, past the 60 GB" \
        in done.stdout


@pytest.mark.parametrize(("argv", "flag", "most"), [
    (("--model", "llama-3-8b", "--context", "100000"), "--context 100,000", "8,192"),
    (("--model", "llama-3-8b", "--context", "1000000000000"), "--context", "1,073,741,824"),  # past any model
    (("--model", "llama-3-70b", "--prompt-tokens", "9000"), "--prompt-tokens 9,000", "8,192"),
    (("--model", "qwen3-8b", "--rate", "1", "--prompt", "40000", "--output", "1000"), "--prompt + --output 41,000",
     "40,960"),
])
def test_a_context_longer_than_the_model_reads_is_refused_naming_the_flag(argv: tuple[str, ...], flag: str,
                                                                          most: str) -> None:
    done = plan(*argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert flag in done.stderr and most in done.stderr and "Traceback" not in done.stderr


def test_the_cache_never_reaches_the_weights_within_an_8192_token_model() -> None:
    """Llama-3-8B: 15.0 GB of weights read a step over 131,072 B a token is ~115,000 tokens, past the 8,192 it
    reads; Llama-3.1-8B (the same shapes, 131,072 positions) does reach it."""
    short = plan("--model", "llama-3-8b").stdout
    assert "cache = weights at      never: at 115,000 tokens, past the 8,192 the model reads" in short
    long = plan("--model", "meta-llama/Llama-3.1-8B-Instruct").stdout
    assert "cache = weights at      115,000 tokens of context" in long


def test_presets_carry_their_configs_max_position_embeddings() -> None:
    assert {k: PRESETS[k].max_context_tokens for k in ("llama-3-8b", "llama-3-405b", "qwen3-8b", "deepseek-v3")} \
        == {"llama-3-8b": 8192, "llama-3-405b": 131072, "qwen3-8b": 40960, "deepseek-v3": 163840}
    assert PRESETS["ref-8b"].max_context_tokens is None
    assert preset_for_hf_id("meta-llama/Llama-3.3-70B-Instruct").max_context_tokens == 131072
    assert preset_for_hf_id("meta-llama/Meta-Llama-3-70B-Instruct").max_context_tokens == 8192


TINY = ("--model-config", str(ROOT / "tests" / "fixtures" / "model-configs" / "tiny-llama.json"))  # reads 2,048


@pytest.mark.parametrize("argv", [(), ("--rate", "2", "--prompt", "500", "--output", "100")])
def test_the_default_context_is_the_models_most_where_it_reads_fewer_than_8000(argv: tuple[str, ...]) -> None:
    # was: "--context 8,000: tiny-llama reads at most 2,048", exit 2, for a --context nobody typed
    done = plan(*TINY, *argv, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    out = out.get("plan", out)
    assert (out["context_tokens"], out["prompt_tokens"]) == (2048, 2048)
    # a model that reads more keeps 8,000 and 2,048
    out = json.loads(plan("--model", "llama-3-8b", "--json").stdout)
    assert (out["context_tokens"], out["prompt_tokens"]) == (8000, 2048)
    # what the user types is still refused past the model, naming the flag
    done = plan(*TINY, "--context", "4000")
    assert done.returncode == 2 and "--context 4,000: tiny-llama reads at most 2,048" in done.stderr
    assert "max_position_embeddings where it reads fewer" in " ".join(plan("--help").stdout.split())


def test_a_wide_output_spread_holds_at_most_the_models_context_and_both_are_shown() -> None:
    # --output-cv 10 on 584 + 249 tokens: P + O (1 + cv^2) / 2 = 13,158 tokens a sequence, past llama-3-8b's 8,192
    # (was sized there, rc 0, and shown nowhere)
    argv = ("--model", "llama-3-8b", "--rate", "10", "--prompt", "584", "--output", "249")
    pools = json.loads(plan(*argv, "--output-cv", "10", "--json").stdout)["pools"]
    assert (pools["output_cv"], pools["running_context_tokens"]) == (10, 8192)
    assert "running context         8,192 tokens a decoding sequence holds on average (P + O (1 + cv^2) / 2 at " \
           "output cv 10" in plan(*argv, "--output-cv", "10").stdout
    pools = json.loads(plan(*argv, "--json").stdout)["pools"]
    assert (pools["output_cv"], pools["running_context_tokens"]) == (0, 584 + 249 / 2)
