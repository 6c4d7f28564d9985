"""Every physics function against the worked numbers of docs/physics.md (H100 SXM: 989e12 FLOP/s, 3.35e12 B/s).

Bytes are decimal (16 GB = 16e9) except KV per token in KiB (128 KiB = 131,072 B).
Each assertion rounds the way the worked example in docs/physics.md does.
"""

from __future__ import annotations

import pytest

from rooflight.agent.roofline import physics as ph

PF, BW = 989e12, 3.35e12
P8, W8 = 8e9, 16e9  # the reference 8B: 8e9 params, 16 GB in BF16
KV8 = 2 * 32 * 8 * 128 * 2  # 131,072 B per token
P70, W70 = 70e9, 140e9
KV70 = 2 * 80 * 8 * 128 * 2  # 327,680 B per token


def test_ridge_points() -> None:
    assert round(ph.ridge_point(PF, BW)) == 295
    assert round(ph.ridge_point(312e12, 2.0e12)) == 156  # A100 80GB with its bandwidth rounded to 2.0 TB/s
    assert round(ph.ridge_point(989e12, 4.8e12)) == 206  # H200


def test_batch_one_decode_sits_at_one_flop_per_byte_and_0_34_percent() -> None:
    i = ph.decode_intensity(1, P8, W8, 0)
    assert i == 1.0
    assert ph.attainable_flops(i, PF, BW) == 3.35e12
    assert round(100 * ph.attainable_flops(i, PF, BW) / PF, 2) == 0.34
    assert ph.attainable_flops(2048, PF, BW) == PF  # prefill of 2,048 tokens: on the compute roof


def test_weights_only_decode_ceiling() -> None:
    step = ph.decode_step_seconds(W8, 0, BW)
    assert round(step * 1e3, 1) == 4.8
    assert round(ph.decode_tokens_per_second(1, step)) == 209
    assert round(ph.compute_seconds(2 * P8, PF) * 1e6) == 16  # the arithmetic: ~16 µs
    assert round(step / ph.compute_seconds(2 * P8, PF)) == 295  # waits ~295x longer than it computes
    assert round(ph.decode_step_seconds(80e9, 0, BW) * 1e3) == 24  # sweeping the whole card
    assert round(ph.decode_step_seconds(W70, 0, BW) * 1e3) == 42  # 70B on one H100


def test_prefill_2048_tokens() -> None:
    assert round(ph.prefill_flops(2048, P8) / 1e12) == 33
    assert round(ph.prefill_seconds(2048, P8, PF, 1.0) * 1e3) == 33
    assert round(ph.prefill_seconds(2048, P8, PF, 0.5) * 1e3) == 66


def test_head_of_line_prefill() -> None:
    assert ph.prefill_flops(8000, P8) == 128e12
    t = ph.prefill_seconds(8000, P8, PF, 0.5)
    assert round(t * 1e3) == 259
    assert round(t / 6e-3) == 43  # worst ITL vs the 6 ms baseline
    assert round(ph.prefill_seconds(512, P8, PF, 0.5) * 1e3, 1) == 16.6  # one 512-token chunk
    assert round(ph.prefill_seconds(4096, P70, PF, 1.0), 2) == 0.58  # 70B, 4k prompt, at the roof
    assert round(ph.prefill_seconds(28_800, P8, PF, 0.5) * 1e3) == 932  # cold worker, turn 20
    assert round(ph.prefill_seconds(1_200, P8, PF, 0.5) * 1e3) == 39  # warm worker


def test_effective_decode_intensity_with_kv() -> None:
    chats = ph.decode_intensity(64, P8, W8, 64 * ph.kv_bytes_per_sequence(KV8, 600))
    longs = ph.decode_intensity(64, P8, W8, 64 * ph.kv_bytes_per_sequence(KV8, 8000))
    assert round(chats) == 49
    assert round(longs) == 12


def test_kv_sizes() -> None:
    assert KV70 / 1024 == 320 and KV8 / 1024 == 128
    assert round(ph.kv_bytes_per_sequence(KV70, 8000) / 1e9, 2) == 2.62
    assert round(ph.kv_bytes_per_sequence(KV8, 8000) / 1e9, 2) == 1.05
    assert round(ph.kv_bytes_per_sequence(KV8, 8192) / 1e9, 2) == 1.07  # max_len 8,192 reservation
    assert round(ph.kv_bytes_per_sequence(KV8, 300) / 1e6) == 39  # a 300-token chat turn
    assert round(ph.kv_bytes_per_sequence(KV8, 600) / 1e6, 1) == 78.6
    assert round(ph.kv_bytes_per_sequence(KV8, 16) / 1e6) == 2  # one partly filled 16-token block
    assert round(100 * ph.kv_bytes_per_sequence(KV8, 2000) / 1e9, 1) == 26.2  # 100 copies of a prompt


def test_max_concurrency() -> None:
    assert ph.max_concurrent_sequences(80e9 - 16e9 - 4e9, ph.kv_bytes_per_sequence(KV8, 8000)) == 57
    free_per_gpu = 80e9 - W70 / 4 - 4e9
    assert free_per_gpu == 41e9
    per_gpu_seq = ph.kv_bytes_per_sequence(KV70 / 4, 8000)  # the cache shards with the heads
    assert ph.max_concurrent_sequences(free_per_gpu, per_gpu_seq) == 62
    paged = ph.max_concurrent_sequences(60e9, ph.kv_bytes_per_sequence(KV8, 600))
    assert round(paged, -1) == 760
    assert ph.max_concurrent_sequences(-1e9, 1e9) == 0 and ph.max_concurrent_sequences(0.5e9, 1e9) == 0


def test_naive_versus_paged_throughput() -> None:
    seq = ph.kv_bytes_per_sequence(KV8, 600)
    naive = ph.decode_step_seconds(W8, 57 * seq, BW)
    paged = ph.decode_step_seconds(W8, 760 * seq, BW)
    assert round(naive * 1e3, 1) == 6.1 and round(paged * 1e3, 1) == 22.6
    assert round(ph.decode_tokens_per_second(57, naive), -2) == 9_300
    assert round(ph.decode_tokens_per_second(760, paged), -2) == 33_600
    assert round(ph.decode_tokens_per_second(760, paged) / ph.decode_tokens_per_second(57, naive), 1) == 3.6


def test_two_decode_ceilings_and_their_crossover() -> None:
    at_1k = 1 / ph.decode_step_seconds(W8, ph.kv_bytes_per_sequence(KV8, 1_000), BW)
    at_100k = 1 / ph.decode_step_seconds(W8, ph.kv_bytes_per_sequence(KV8, 100_000), BW)
    kv_only = 1 / ph.decode_step_seconds(0, ph.kv_bytes_per_sequence(KV8, 100_000), BW)
    assert (round(at_1k), round(at_100k), round(kv_only)) == (208, 115, 256)
    # "~102 tok/s counting only the cache at 100K" is the 70B's cache (327,680 B/token):
    assert round(1 / ph.decode_step_seconds(0, ph.kv_bytes_per_sequence(KV70, 100_000), BW)) == 102
    assert round(ph.kv_weight_crossover_tokens(W8, KV8), -3) == 122_000


def test_quantized_weights_double_the_ceiling() -> None:
    step = ph.decode_step_seconds(8e9, 0, BW)
    assert round(step * 1e3, 2) == 2.39 and round(1 / step) == 419


def test_mbu_and_mfu() -> None:
    assert round(100 * ph.mbu(W8, 0, 146, BW)) == 70
    assert round(1 / ph.mbu(W8, 0, 146, BW), 1) == 1.4  # at most ~1.4x headroom
    assert round(100 * ph.mfu(146, P8, PF), 2) == 0.24
    assert round(100 * ph.mfu(20_000, P8, PF)) == 32
    # Peak of the model's GPUs = tp x per-GPU peak: whole-model bytes over 4 GPUs' bandwidth.
    assert ph.mbu(W70, 0, 20, 4 * BW) == pytest.approx(ph.mbu(W70 / 4, 0, 20, BW))


def test_tensor_parallel_70b() -> None:
    comm = ph.tensor_parallel_allreduce_seconds(80, 4, 5e-6)
    assert round(comm * 1e3, 1) == 0.8
    step = ph.decode_step_seconds(W70 / 4, 0, BW)
    assert round(step * 1e3, 1) == 10.4 and round((step + comm) * 1e3, 1) == 11.2
    assert round(1 / (step + comm), -1) == 90
    assert round(ph.tensor_parallel_allreduce_seconds(80, 4, 25e-6) * 1e3) == 4  # over PCIe
    assert ph.tensor_parallel_allreduce_seconds(80, 1, 5e-6) == 0


def test_other_worked_numbers() -> None:
    assert round(ph.cost_per_million_tokens(2, 2_200), 2) == 0.25
    assert round(ph.cost_per_million_tokens(2, 5_000), 2) == 0.11


def test_kv_layer_tokens_cap_windowed_layers() -> None:
    assert ph.kv_layer_tokens(32_000, 32) == 32 * 32_000
    assert ph.kv_layer_tokens(32_000, 0, [(4096, 32)]) == 32 * 4096  # Mistral v0.1
    assert ph.kv_layer_tokens(2_000, 0, [(4096, 32)]) == 32 * 2_000  # below the window: linear
    assert ph.kv_layer_tokens(8192, 21, [(4096, 21)]) == 21 * 8192 + 21 * 4096  # Gemma 2


def test_prefill_is_the_longer_of_compute_and_weight_streaming() -> None:
    # 8B in bf16 on an H100: W = 2P, so the crossover is the ridge, 295 tokens.
    assert ph.prefill_crossover_tokens(16e9, 8e9, 989e12, 3.35e12) == pytest.approx(989e12 / 3.35e12)
    assert ph.weight_stream_seconds(16e9, 3.35e12) == pytest.approx(4.776e-3, rel=1e-3)
    assert ph.prefill_seconds_bound(100, 8e9, 989e12, 1.0, 16e9, 3.35e12) == ph.weight_stream_seconds(16e9, 3.35e12)
    assert ph.prefill_seconds_bound(2048, 8e9, 989e12, 0.5, 16e9, 3.35e12) == ph.prefill_seconds(2048, 8e9, 989e12, 0.5)
    # fp8 weights (W = P) against the fp8 peak (2x): the crossover stays at the ridge of 16-bit math.
    assert ph.prefill_crossover_tokens(8e9, 8e9, 1979e12, 3.35e12) == pytest.approx(1979e12 / 3.35e12 / 2)
