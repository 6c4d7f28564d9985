"""The figures docs/physics.md quotes from `rooflight plan` are what the command prints: each case names the
doc's words, the command, and the words the command must print, so a change to plan that moves a figure
fails here until the manual says the new one."""

from __future__ import annotations

import argparse
import re

import pytest

from rooflight.agent.plan_cli import register
from support import ROOT

PHYSICS = ROOT / "docs" / "physics.md"

# (the doc's words, the `rooflight plan` flags, the words it prints)
CASES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ('decode ceiling, `rooflight plan --model llama-3-8b`: "4.48 ms/token, 223 tok/s"', ("--model", "llama-3-8b"),
     "decode ceiling          4.48 ms/token, 223 tok/s"),
    ('prints "9.9 ms at peak compute", "19.8 ms at 50% MFU" and a 3,460-token crossover',
     ("--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--prompt-tokens", "2048"),
     "9.9 ms at peak compute"),
    ('"19.8 ms at 50% MFU" and a 3,460-token crossover',
     ("--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--prompt-tokens", "2048"),
     "17.5 ms at the compute roof, 19.8 ms at 50% MFU"),
    ("a 3,460-token\n  crossover", ("--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--prompt-tokens", "2048"),
     "shorter than the 3,460-token crossover"),
    ("4,760 with `--gpu h100-sxm`", ("--model", "deepseek-v3", "--gpu", "h100-sxm", "--tp", "8", "--prompt-tokens",
                                     "2048"), "shorter than the 4,760-token crossover"),
    ('"10.4 ms/token" weights only', ("--model", "ref-70b", "--tp", "4"), "decode ceiling          10.4 ms/token"),
    ('"11.5 ms/step,\n  87.3 tok/s"', ("--model", "ref-70b", "--tp", "4"),
     "with TP at batch 1      11.5 ms/step, 87.3 tok/s in all (all-reduces 0.809 ms"),
    ('`--context 600 --batch 57`: "6.11 ms/step"', ("--context", "600", "--batch", "57"),
     "decode at batch 57      6.11 ms/step"),
    ("(at the default 8,000 tokens, batch 57 takes 22.6 ms)", ("--batch", "57"), "decode at batch 57      22.6 ms/step"),
    ("`--context 600 --batch 760`: 22.6 ms per step, ~33,600 tok/s", ("--context", "600", "--batch", "760"),
     "decode at batch 760     22.6 ms/step, 33,600 tok/s"),
    ("`--batch 64 --context 600`: intensity **49.6**", ("--batch", "64", "--context", "600"), "intensity 49.6 FLOP/byte"),
    ("`--context 8000`: **15.6** (past the 57 sequences", ("--batch", "64", "--context", "8000"),
     "intensity 15.6 FLOP/byte"),
    ('plan says "BEYOND THE KV WALL"', ("--batch", "64", "--context", "8000"), "BEYOND THE KV WALL"),
    ('At 1 req/s (`--rate 1`): "share one pool of 2 groups" at 15% busy',
     ("--rate", "1", "--prompt", "2000", "--output", "250", "--prefill-capacity", "10000", "--decode-capacity",
      "2500"), "Verdict: share one pool of 2 groups"),
    ('"share one pool of 2 groups" at 15% busy', ("--rate", "1", "--prompt", "2000", "--output", "250",
                                                  "--prefill-capacity", "10000", "--decode-capacity", "2500"),
     "one shared pool         2 groups at 15% busy"),
    ('"one prompt\'s prefill holds\na group 159 ms"', ("--model", "llama-3-70b", "--tp", "4", "--rate", "1000",
                                                       "--prompt", "2000", "--output", "250"),
     "one prompt's prefill holds a group 159 ms"),
    ("--batch-max 256 --itl-slo 1` gives 30.53 and 15,480", ("--model", "llama-3-8b", "--rate", "10", "--prompt", "584",
                                                              "--output", "249", "--batch-max", "256", "--itl-slo", "1"),
     "one group               30.5 req/s at this mix"),
    ("`--output-cv 0.795` 29.54 and 14,490", ("--model", "llama-3-8b", "--rate", "10", "--prompt", "584", "--output",
                                              "249", "--batch-max", "256", "--itl-slo", "1", "--output-cv", "0.795"),
     "one group               29.5 req/s at this mix"),
    ("in **7.43 ms**, 3.8 tokens kept: **511** tok/s", ("--model", "llama-3-8b", "--draft-model", "llama-3.2-1b",
                                                         "--num-speculative-tokens", "4", "--draft-acceptance", "0.7"),
     "decode ceiling          7.43 ms/step, 511 tok/s"),
    ("`--draft-acceptance 0.443`, 2.77 tokens kept", ("--model", "llama-3-8b", "--draft-model", "llama-3.2-1b",
                                                      "--num-speculative-tokens", "4", "--draft-acceptance", "0.443"),
     "runs the draft 4 times and keeps 2.77"),
    ("`--itl-slo 0.02`: a decode batch of **28**", ("--model", "llama-3-70b", "--tp", "4", "--rate", "10", "--prompt",
                                                     "2000", "--output", "250", "--itl-slo", "0.02", "--draft-model",
                                                     "llama-3.2-1b", "--num-speculative-tokens", "4",
                                                     "--draft-acceptance", "0.7"), "decode batch 28)"),
)


def _plan(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]) -> str:
    ap = argparse.ArgumentParser(prog="rooflight")
    register(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["plan", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize(("doc", "argv", "printed"), CASES, ids=[" ".join(c[1]) or "default" for c in CASES])
def test_the_manual_quotes_what_plan_prints(capsys: pytest.CaptureFixture[str], doc: str, argv: tuple[str, ...],
                                            printed: str) -> None:
    assert _words(doc) in _words(PHYSICS.read_text()), f"docs/physics.md no longer says: {doc}"
    assert printed in _plan(capsys, argv), f"rooflight plan {' '.join(argv)} no longer prints: {printed}"
