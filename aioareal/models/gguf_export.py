"""A Hugging Face causal LM directory (a checkpoint's `policy/`) as one GGUF file for llama.cpp and Ollama.

Written with `gguf.GGUFWriter` under llama.cpp's names, for `llama` and `qwen2` (where llama.cpp and
transformers' reader agree on the layout). As llama.cpp's converter does, llama's q/k rows are
permuted into its rotary layout and tied embeddings write no `output.weight`. Matrices are f16 or
q8_0 (rows not divisible by 32 stay f16); norms and biases f32. The tokenizer goes in the metadata
(gguf_vocab.py). The file is written beside its destination and renamed (docs/architecture.md
rule 6); a killed export's temporary file, named by its pid, is removed by the next export once
that pid is dead.
"""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import UserError
from .gguf_convert import INSTALL_HINT
from .gguf_vocab import vocab_of, write_vocab

TYPES = ("f16", "q8_0")
ARCHITECTURES = ("llama", "qwen2")
Q8_BLOCK = 32
# HF name inside a decoder layer -> llama.cpp name
LAYER_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}


def export_gguf(model: Any, tokenizer: Any, out: Path, qtype: str = "f16", name: str = "aioareal") -> Path:
    """Write `model` (a transformers llama/qwen2 causal LM) and `tokenizer` to the GGUF file `out`."""
    if importlib.util.find_spec("gguf") is None:
        raise UserError(f"export: writing a GGUF file needs the gguf package: {INSTALL_HINT} (or pip install gguf)")
    import gguf

    arch = model.config.model_type
    if arch not in ARCHITECTURES:
        raise UserError(f"export: a {arch} model; GGUF export writes {' and '.join(ARCHITECTURES)} models")
    if qtype not in TYPES:
        raise UserError(f"export: --type {qtype}: expected one of {', '.join(TYPES)}")
    rows = model.get_input_embeddings().weight.shape[0]
    vocab = vocab_of(tokenizer, rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    _clear_husks(out)
    tmp = out.with_name(f"{_tmp_prefix(out)}{os.getpid()}")
    try:
        writer = gguf.GGUFWriter(str(tmp), arch)
        _write_config(writer, model.config, name, rows, qtype)
        write_vocab(writer, vocab)
        for gguf_name, array in _tensors(model):
            _add_tensor(writer, gguf_name, array, qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _tmp_prefix(out: Path) -> str:
    """Temporary files of exports to `out` are named this and the writer's pid."""
    return f".{out.name}.tmp-"


def _clear_husks(out: Path) -> None:
    """Remove the temporary files that killed exports to `out` left; one UserError line if a live
    process is writing `out` now (two writers would rename over each other)."""
    prefix = _tmp_prefix(out)
    for husk in out.parent.glob(f"{prefix}*"):
        pid = husk.name[len(prefix):]
        if not pid.isdigit() or husk.is_symlink() or not husk.is_file():
            continue  # not one of ours: left alone
        if int(pid) != os.getpid() and _alive(int(pid)):
            raise UserError(f"export: {out} is being written by another export now (pid {pid}, {husk.name}); "
                            "wait for it, or export to another file")
        husk.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid < 1:
        return False  # os.kill(0, ...) would ask about our own process group
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone; a number no process has
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


def _write_config(writer: Any, config: Any, name: str, rows: int, qtype: str) -> None:
    import gguf

    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if qtype == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(rows)


def _tensors(model: Any) -> Iterator[tuple[str, np.ndarray]]:
    """(llama.cpp name, float32 array) for every weight and bias the model has."""
    config = model.config
    state = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in model.state_dict().items()}
    yield "token_embd.weight", state["model.embed_tokens.weight"]
    yield "output_norm.weight", state["model.norm.weight"]
    if not config.tie_word_embeddings:
        yield "output.weight", state["lm_head.weight"]
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    for layer in range(config.num_hidden_layers):
        for hf, cpp in LAYER_NAMES.items():
            for kind in ("weight", "bias"):
                array = state.get(f"model.layers.{layer}.{hf}.{kind}")
                if array is None:
                    continue
                if config.model_type == "llama" and cpp in ("attn_q", "attn_k"):
                    array = _permute(array, config.num_attention_heads if cpp == "attn_q" else kv_heads)
                yield f"blk.{layer}.{cpp}.{kind}", array


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp keeps each head's rotary pairs interleaved (its converter's permute); transformers undoes it.
    rows = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, rows, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape).copy()


def _add_tensor(writer: Any, name: str, array: np.ndarray, qtype: str) -> None:
    import gguf

    if array.ndim == 1:  # norms and biases: f32, as llama.cpp reads them
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    elif qtype == "q8_0" and array.shape[-1] % Q8_BLOCK == 0:
        data = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float16))
