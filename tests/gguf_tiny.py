"""A tiny llama-architecture GGUF file for the fast GGUF tests, written with the `gguf` package (or a
qwen2 one: any family transformers maps loads the same way).

The weights come from a seeded random `LlamaForCausalLM` and are written the way llama.cpp's
converter writes them (q/k rows permuted into its rotary layout, no `output.weight` for tied
embeddings), in float32, so a correct conversion gives back exactly the model it came from. The
tokenizer is a byte-level BPE with the three SmolLM2-style specials and a chat template, as
transformers needs one in the metadata to build the tokenizer.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGED = ["he", "ll"]
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
                 "+ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")
HEADS, KV_HEADS, HIDDEN, LAYERS = 4, 2, 32, 2
TOKENS = SPECIALS + sorted(bytes_to_unicode().values()) + MERGED
# HF name inside a layer -> llama.cpp name
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}


def tiny_llama(seed: int = 0, arch: str = "llama") -> LlamaForCausalLM | Qwen2ForCausalLM:
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(vocab_size=len(TOKENS), hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
                          num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128,
                          rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():  # norms start at exactly 1; random ones show a mix-up of norm tensors
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):  # qwen2's q/k/v biases start at 0, which would hide a mix-up
                p.normal_()
    return model


def write_tiny_gguf(path: Path, seed: int = 0, name: str = "tiny-llama", arch: str = "llama",
                    declared: str | None = None):
    """Write the tiny model of architecture `arch` ("llama" or "qwen2") as a GGUF file at `path`,
    its `general.architecture` `declared` (default `arch`); returns the model it holds."""
    import gguf

    model = tiny_llama(seed, arch)
    writer = gguf.GGUFWriter(str(path), declared or arch)
    _write_config(writer, model.config, name)
    _write_tokenizer(writer)
    for gguf_name, array in _gguf_tensors(model):
        writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def _write_config(writer, config: LlamaConfig, name: str) -> None:
    writer.add_name(name)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)


def _write_tokenizer(writer) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))  # 3: control, 1: normal
    writer.add_token_merges([" ".join(pair) for pair in MERGED])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def _gguf_tensors(model: LlamaForCausalLM | Qwen2ForCausalLM):
    """(llama.cpp name, float32 array) for every weight; tied embeddings write no `output.weight`.
    Only llama's q/k rows are permuted (llama.cpp's converter leaves qwen2's as they are)."""
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    yield "token_embd.weight", state["model.embed_tokens.weight"]
    yield "output_norm.weight", state["model.norm.weight"]
    for layer in range(model.config.num_hidden_layers):
        for hf, cpp in LAYER_NAMES.items():
            array = state[f"model.layers.{layer}.{hf}.weight"]
            llama = model.config.model_type == "llama"
            if llama and cpp in ("attn_q", "attn_k"):
                array = _permute(array, HEADS if cpp == "attn_q" else KV_HEADS)
            yield f"blk.{layer}.{cpp}.weight", array
            bias = state.get(f"model.layers.{layer}.{hf}.bias")
            if bias is not None:  # qwen2's q/k/v biases
                yield f"blk.{layer}.{cpp}.bias", bias


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp keeps each head's rotary pairs interleaved; transformers undoes this on load.
    rows = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, rows, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape).copy()
