"""Make the tiny random-weight Llama the real-engine tests serve with vLLM: no download, ~5 s.

Owns the model the real-engine stage uses: a 2-layer GQA Llama (hidden 256, 4 query heads,
2 KV heads, head_dim 64, intermediate 512, bf16) and a byte-level BPE tokenizer trained here on
text that is always present (Debian's licence texts plus a fixed fallback), with a chat template.
The weights are random (seeded), so the output is gibberish; the tests use ignore_eos, so every
request generates exactly max_tokens and the counts are predictable.

Run with the vLLM venv's python (it has torch, transformers, tokenizers, safetensors):
    HF_HUB_OFFLINE=1 python make_tiny_llama.py OUT_DIR
`--no-weights` writes the tokenizer and config.json only (no torch needed): what Dynamo's mocker
reads (the Dynamo stage, .ci/dynamo.sh).
"""

from __future__ import annotations

import glob
import json
import os
import sys

# The shapes the tests' expectations (parameters, KV bytes per token) are derived from.
SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}
VOCAB = 2048
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def training_text() -> list[str]:
    """Text to train the tokenizer on: local licence files if any, always a fixed fallback."""
    texts = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="ignore") as f:
                texts.append(f.read())
    texts.append("the quick brown fox jumps over the lazy dog. " * 64)
    texts.append("prefill decode step ridge intensity occupancy preemption token metric model. " * 64)
    return texts


def build_tokenizer(out: str):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text(), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=SHAPE["max_position_embeddings"],
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out)
    # Loaders differ in where they look for the template; write both places.
    with open(os.path.join(out, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(CHAT_TEMPLATE)
    return hf_tok


def build_model(out: str, hf_tok) -> int:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(hf_tok)).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def llama_config(hf_tok):  # -> LlamaConfig
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(hf_tok),
        rms_norm_eps=1e-5,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        architectures=["LlamaForCausalLM"],  # Dynamo's model card refuses a config.json without it
        **SHAPE,
    )


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if a != "--no-weights"]
    out = args[0] if args else "tiny-llama"
    os.makedirs(out, exist_ok=True)
    hf_tok = build_tokenizer(out)
    if "--no-weights" in argv:
        llama_config(hf_tok).save_pretrained(out)
        params = None
    else:
        params = build_model(out, hf_tok)
    print(json.dumps({"out": out, "parameters": params, "vocab_size": len(hf_tok), **SHAPE}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
