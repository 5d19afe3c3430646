"""The engine's rotary tables, taken from the model's own rotary module.

Every RoPE variant transformers implements (default, linear, dynamic, yarn, longrope, llama3)
lives in the model's `rotary_emb`, which maps positions to cos/sin with its attention scaling
already applied. The engine asks it once for positions [0, max_len) and gathers rows of the
tables per pass, so decode costs the same for every variant. The two variants whose frequencies
depend on the sequence's length (dynamic, longrope) give the same tables as a short sequence
only while max_len stays within their original length; families.py refuses longer contexts.
Gemma 3 keeps one table per layer type (local and global layers use different bases).
"""
from __future__ import annotations

import torch
from transformers import PreTrainedModel

Tables = tuple[torch.Tensor, torch.Tensor]  # cos, sin: (max_len, rotary_dim) each


@torch.no_grad()
def rotary_tables(model: PreTrainedModel, max_len: int) -> dict[str | None, Tables]:
    """{layer type: (cos, sin)}: one entry keyed None, or one per layer type where the model's
    rotary module keeps several (Gemma 3)."""
    rotary = model.model.rotary_emb
    weight = model.get_input_embeddings().weight
    probe = torch.zeros(1, dtype=weight.dtype, device=weight.device)  # only its dtype and device are read
    positions = torch.arange(max_len, device=weight.device)[None]
    kinds = getattr(rotary, "layer_types", None)
    if not kinds:
        cos, sin = rotary(probe, positions)
        return {None: (cos[0], sin[0])}
    tables = {}
    for kind in kinds:
        cos, sin = rotary(probe, positions, kind)
        tables[kind] = (cos[0], sin[0])
    return tables
