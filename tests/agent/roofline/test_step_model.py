"""One step model behind every number: agent/roofline/step.py is the only code that computes the bytes or the
FLOPs of a step, and every consumer calls it.

Read from the source with `ast` (nothing is imported), as tests/agent/test_layers.py reads the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from support import ROOT

# Where a step's bytes and FLOPs may be computed: the step model, and the model constants and formulas it is
# built from.
STEP_MODEL = ROOT / "agent" / "roofline" / "step.py"
BUILDING_BLOCKS = (ROOT / "agent" / "roofline" / "models.py", ROOT / "agent" / "roofline" / "physics.py")

# The pieces of a step's cost: ModelSpec's byte and FLOP counts of a step, and physics.py's formulas of one.
# Anything else that names one is computing a step on its own.
MODEL_PIECES = frozenset({  # ModelSpec's cached counts, read
    "routed_expert_bytes", "attention_flops_per_pair", "matmul_params_active", "prefill_matmul_params",
    "kv_bytes_per_layer_token",
})
MODEL_METHODS = frozenset({  # ModelSpec's counts of a step, called
    "weight_bytes_streamed", "decode_weight_bytes", "attention_flops", "kv_bytes_per_sequence",
    "kv_bytes_per_sequence_per_gpu", "kv_bytes_per_token_per_gpu", "kv_pool_layers", "context_for_sequence_kv_bytes",
})
PHYSICS_PIECES = frozenset({
    "FLOPS_PER_PARAM_PER_TOKEN", "decode_step_seconds", "decode_step_seconds_roofline", "decode_intensity",
    "prefill_flops", "prefill_seconds", "prefill_seconds_bound", "prefill_seconds_per_token", "mbu", "mfu",
    "weight_stream_seconds", "prefill_crossover_tokens", "attended_tokens", "kv_layer_tokens",
    "tensor_parallel_allreduce_seconds_at", "decode_tokens_per_second_ceiling", "decode_bandwidth_headroom",
})
PHYSICS = "rooflight.agent.roofline.physics"
# Model constants that, multiplied or divided by anything but a plain number (1e9, 1024), make FLOPs.
STEP_FACTORS = frozenset({"params_active", "params_total", "expert_params", "embedding_params", "lm_head_params"})


def _sources() -> list[Path]:
    """Every module of the agent and the collectors but the step model and its building blocks."""
    skip = {STEP_MODEL, *BUILDING_BLOCKS}
    return sorted(p for folder in (ROOT / "agent", ROOT / "collectors") for p in folder.rglob("*.py") if p not in skip)


def _physics_aliases(tree: ast.AST) -> set[str]:
    """The names a module binds to physics.py (`from rooflight.agent.roofline import physics as ph`, ...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "rooflight.agent.roofline":
            names |= {a.asname or a.name for a in node.names if a.name == "physics"}
        elif isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name == PHYSICS}
    return names


def step_arithmetic(source: str, where: str = "<source>") -> list[str]:
    """Where `source` computes a step's bytes or FLOPs itself: a ModelSpec piece of a step read or called, a
    physics.py formula of one (through the module or imported), or a model's parameter count multiplied or
    divided by something that is not a plain number."""
    tree = ast.parse(source, filename=where)
    physics = _physics_aliases(tree)
    found = []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and node.attr in MODEL_PIECES:
            found.append(f"{line} uses {node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MODEL_METHODS:
            found.append(f"{line} calls {node.func.attr}")
        if (isinstance(node, ast.Attribute) and node.attr in PHYSICS_PIECES and isinstance(node.value, ast.Name)
                and node.value.id in physics):
            found.append(f"{line} uses physics.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == PHYSICS:
            found += [f"{line} imports {a.name}" for a in node.names if a.name in PHYSICS_PIECES]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.FloorDiv)):
            sides = (node.left, node.right)
            factor = next((side.attr for side in sides if isinstance(side, ast.Attribute) and side.attr in STEP_FACTORS),
                          None)
            if factor and not any(isinstance(side, ast.Constant) for side in sides):
                found.append(f"{line} multiplies {factor}")
    return found


def test_no_code_but_the_step_model_computes_the_bytes_or_flops_of_a_step() -> None:
    found = [line for path in _sources()
             for line in step_arithmetic(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, "a step computed outside agent/roofline/step.py:\n" + "\n".join(found)


def test_the_check_sees_what_it_guards() -> None:
    # what headroom.py and status.py on main did: a step of their own
    assert step_arithmetic("step = physics.decode_step_seconds_roofline(batch, model.weight_bytes_streamed(batch),"
                           " kv, model.params_active, flops, bw)")
    assert step_arithmetic("x = per_step * physics.FLOPS_PER_PARAM_PER_TOKEN * c.model.params_active")
    assert step_arithmetic("per_token = c.model.kv_bytes_per_token_per_gpu(tp) * tp")
    assert step_arithmetic("flops = tokens * 2 * model.params_active")
    assert step_arithmetic("from rooflight.agent.roofline.physics import prefill_flops")
    assert step_arithmetic("from rooflight.agent.roofline import physics as ph\nt = ph.decode_step_seconds(w, kv, bw)")
    # what consumers do now: ask the step model; and units are not arithmetic
    assert not step_arithmetic("cost = layout.cost(Step(decode=Decode(batch, context)))\nseconds = cost.seconds(roofs)")
    assert not step_arithmetic("text = sig(p.params_active / 1e9)")
    # the consumers the issue names call it
    for consumer in ("agent/signals/derive.py", "agent/signals/headroom.py", "agent/signals/bounds.py",
                     "agent/roofline/plan.py", "agent/serve/status.py", "agent/demo/plant.py"):
        text = (ROOT / consumer).read_text()
        assert "rooflight.agent.roofline.step import" in text or "roofline.step" in text, consumer


def test_a_histograms_buckets_become_points_whose_mean_is_its_sum() -> None:
    # vLLM's iteration_tokens buckets over a window: 503 steps in (8, 16], 2 in (32, 64], 1 in (64, 128],
    # 2 in (512, 1024], 9,784 tokens in all. Whole tokens: 9..16, 33..64, 65..128, 513..1024; one fraction f
    # of each range with the points' mean 9,784 / 508: f = (9,784 - 5,684) / 4,668 = 0.878.
    from rooflight.agent.roofline.step import Lengths

    bounds = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, float("inf"))
    cumulative = (0, 0, 503, 503, 505, 506, 506, 506, 508, 508)
    mix = Lengths.from_histogram(bounds, cumulative, 9784.0)
    f = 4100 / 4668
    expected = ((503 / 508, 9 + 7 * f), (2 / 508, 33 + 31 * f), (1 / 508, 65 + 63 * f), (2 / 508, 513 + 511 * f))
    assert mix is not None and len(mix.points) == 4
    for got, want in zip(mix.points, expected):
        assert got == pytest.approx(want)
    assert mix.mean() == pytest.approx(9784 / 508)
    # one bucket holding everything: its observations' mean, exactly; the first bucket of whole tokens is 1
    assert Lengths.from_histogram((1000.0, 2000.0, float("inf")), (0, 10, 10), 12_345.0).points == ((1.0, 1234.5),)
    assert Lengths.from_histogram((1.0, 8.0, float("inf")), (4, 4, 4), None).points == ((1.0, 1.0),)
    assert Lengths.from_histogram((1.0, float("inf")), (0, 0), 0.0) is None  # no observations
