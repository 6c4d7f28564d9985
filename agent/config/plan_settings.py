"""`rooflight plan`'s settings (agent/config/settings.py declares every command's; this is its plan part).

Its own flags, and how it reads those it shares with `rooflight run`: the model, its dtypes, the GPU, the
TP, the batch cap and the SLOs are one declaration each in settings.py, offered by both commands; the
calculator gives them its own defaults and words (a default GPU profile, TP 1, the dtypes it knows).
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.config.setting import PLAN, Setting
from rooflight.agent.roofline.gpus import DEFAULT_PROFILE_KEY
from rooflight.agent.roofline.plan import (
    DEFAULT_CONTEXT_TOKENS, DEFAULT_DECODE_MBU, DEFAULT_ITL_SLO_SECONDS, DEFAULT_PROMPT_TOKENS, DEFAULT_TTFT_SLO_SECONDS,
)

POOLS = "capacity and pools (docs/physics.md, section Headroom)"  # its --help section for --rate and the pools
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "fp4")
KV_DTYPES = ("bf16", "fp16", "fp8", "int8")

# How `rooflight plan` reads the settings it shares with `rooflight run` (Setting.per), by key, and where each
# stands among its flags (`after`).
SHARED: dict[str, dict[str, Any]] = {
    "model": {
        "after": "", "metavar": None,
        "help": "preset name or Hugging Face id (default ref-8b, the reference 8B of docs/physics.md, with 8e9 "
                "params); presets: llama-3-8b, llama-3-70b, llama-3-405b, qwen3-8b, mixtral-8x7b, deepseek-v3, ..."},
    "model_config": {"after": "model", "help": "a Hugging Face config.json (or its directory)"},
    "gpu": {
        "after": "model_config", "metavar": None, "flag_default": None,
        "help": f"GPU profile, e.g. h100-sxm, h200, a100-sxm-80gb, l40s (default {DEFAULT_PROFILE_KEY}; with "
                "--from-live, the live agent's GPU from its rooflight_gpu_info)"},
    "tp": {
        "after": "gpu", "metavar": None, "flag_default": None,
        "help": "tensor-parallel size: GPUs one model copy spans; weights and KV heads split across them (default 1; "
                "with --from-live, the live agent's rooflight_tensor_parallel_size)"},
    "ep": {
        "after": "tp", "metavar": None, "flag_default": 1,
        "help": "expert-parallel size: GPUs the routed experts are spread over (vLLM --enable-expert-parallel: "
                "data-parallel x tensor-parallel size); each copy of --tp GPUs holds --tp/--ep of them and its steps "
                "read only those; --rate counts groups of max(--tp, --ep) GPUs, one EP group (default %(default)s)"},
    "draft_model": {
        "after": "ep",
        "help": "speculative decoding's draft model (a preset or Hugging Face id, as `rooflight run --draft-model`): "
                "each decode step runs it --num-speculative-tokens times and verifies that many tokens more; its "
                "weights and KV take memory beside the model's"},
    "draft_model_config": {"after": "draft_model", "help": "the draft model's config.json (instead of --draft-model)"},
    "weight_dtype": {
        "after": "prefill_mfu", "metavar": None, "choices": WEIGHT_DTYPES,
        "help": "override the weight dtype: fewer bytes raise the decode ceiling"},
    "kv_dtype": {
        "after": "weight_dtype", "metavar": None, "choices": KV_DTYPES,
        "help": "override the KV-cache dtype: fp8 halves the cache"},
    "batch_max": {
        "after": "decode_capacity", "metavar": None, "flag_default": 256, "group": POOLS,
        "help": "the decode batch cap for the physics capacity, like vLLM's max_num_seqs (default %(default)s)"},
    "itl_slo": {
        "after": "decode_mbu", "type": float, "flag_default": DEFAULT_ITL_SLO_SECONDS, "group": POOLS,
        "help": "the p99 inter-token latency target: the physics decode batch is the largest whose step meets it "
                "(with a draft model its whole verify step, draft passes and all: vLLM observes ITL once a verify "
                "step), "
                "and a shared pool's decodes may wait this long for one prompt's prefill (default %(default)s)"},
    "ttft_slo": {
        "after": "itl_slo", "type": float, "flag_default": DEFAULT_TTFT_SLO_SECONDS, "group": POOLS,
        "help": "the p99 time-to-first-token target the prefill (or shared) pool is sized for, with an M/M/c "
                "queue (default %(default)s)"},
}


def _plan(key: str, help_: str, **kw: Any) -> Setting:
    return Setting(key, help_, commands=(PLAN,), env=False, file=False, **kw)


SETTINGS: tuple[Setting, ...] = (
    _plan("context", "tokens per sequence (prompt + output) for KV sizing and the decode ceiling at context "
          f"(default {DEFAULT_CONTEXT_TOKENS}, or the model's max_position_embeddings where it reads fewer)",
          type=int),
    _plan("batch", "concurrent sequences for the decode step, throughput and arithmetic intensity (default "
          "%(default)s)", type=int, flag_default=1),
    _plan("prompt_tokens", f"prompt length for the prefill estimate (default {DEFAULT_PROMPT_TOKENS}, or the "
          "model's max_position_embeddings where it reads fewer)", type=int),
    _plan("prefill_mfu", "fraction of peak a real prefill reaches; 0.4-0.6 is strong (default %(default)s)",
          type=float, flag_default=0.5),
    _plan("reserved_gb", "GB per GPU kept for runtime and activations, not KV (default %(default)s)", type=float,
          flag_default=4.0),
    _plan("num_speculative_tokens", "with a draft model: the tokens it proposes a step, k (vLLM's "
          "speculative_config num_speculative_tokens)", type=int, metavar="K"),
    _plan("draft_acceptance", "with a draft model: accepted / proposed draft tokens, A (vLLM's "
          "spec_decode_num_accepted_tokens / spec_decode_num_draft_tokens, the live agent's "
          "rooflight_spec_decode_acceptance_ratio); a step yields 1 + A x k tokens a sequence. Not a per-position "
          "acceptance a (each draft token kept where the one before was): that is A = (a + a^2 + ... + a^k) / k, "
          "a = 0.7 at k = 4 is A = 0.443",
          type=float, metavar="RATIO"),
    _plan("json", "print every figure in base units as JSON", action="store_true", flag_default=False),
    _plan("list", "list the model presets and GPU profiles", action="store_true", flag_default=False),
    _plan("rate", "size prefill and decode pools for this request rate, and say whether one shared pool is the "
          "better answer", type=float, metavar="REQ_PER_S", group=POOLS),
    _plan("prompt", "mean prompt tokens per request for --rate (default with --from-live: the live mix)", type=float,
          metavar="TOKENS", group=POOLS),
    _plan("output", "mean output tokens per request for --rate (default with --from-live: the live mix)", type=float,
          metavar="TOKENS", group=POOLS),
    _plan("output_cv", "the output lengths' coefficient of variation (standard deviation / mean) for the physics "
          "decode capacity: a request is in the running batch for as many steps as its output is long, so the "
          "batch's mean context is P + O (1 + cv^2) / 2 (a lognormal of sigma s: cv = sqrt(exp(s^2) - 1); the "
          "demo's 0.7: 0.80) (default 0: every output alike)", type=float,
          metavar="CV", group=POOLS),
    _plan("prefill_capacity", "prefill tokens/s one group carries (default: the model on --gpu at --prefill-mfu, or "
          "the live agent's)", type=float, metavar="TOK_PER_S", group=POOLS),
    _plan("decode_capacity", "decode tokens/s one group carries (default: the roofline at --decode-mbu and the KV "
          "wall, or the live agent's)", type=float, metavar="TOK_PER_S", group=POOLS),
    _plan("decode_mbu", "fraction of the bandwidth peak decode reaches; 0.6-0.8 is healthy (default %(default)s)",
          type=float, flag_default=DEFAULT_DECODE_MBU, group=POOLS),
    _plan("from_live", "read a running agent's /metrics (its URL, e.g. http://127.0.0.1:9746): its headroom, "
          "saturation and capacity at the live mix", metavar="URL", group=POOLS),
    _plan("window", "the live window to read, e.g. 1m (default: the longest)", metavar="NAME", group=POOLS),
)
