"""How many FLOPs a phase does, and its achieved FLOP/s as a fraction of the matmul peak of the
dtype it computes in (peak.py): the compute-side counterpart of the decode roofline (roofline.py).

The FLOP model counts the matmuls' weights only (Kaplan et al. 2020, sec. 2.1), with N the
non-embedding parameters (roofline.non_embedding_params) and H the LM head's (vocab x hidden; a
tied embedding is counted once, as the head; an embedding lookup costs no FLOPs):

  decode    2 (N + H) per decoded token: the engine computes logits for every decoded token;
  prefill   2 N per prompt token + 2 H per logits row: the engine computes logits only at each
            prompt's last token, once for each of the prompt's G samples (the last hidden state is
            repeated before the head);
  train     6 N per trained position (forward 2, backward 4) + 6 H per position the LM head runs
            on: the trainer's chunked log-probs run it over completion positions only (the naive
            baseline of `bench train` over every position).

Approximations, all of which make a fraction a lower bound on the work the device did:
attention's context term (scores and weighted sums, growing with the context) is left out; the
chunked log-probs' recompute of the head's forward in backward (activation checkpointing) is not
counted; decode counts the tokens sampled, not the finished slots a decode step may still carry;
norms, rotary embeddings, activations and sampling are left out. A trained position is one the
forward computes (padding included, as the matmuls do it); with the prefix tree the head runs on
distinct (prefix, token) pairs, which can be fewer than the completion positions counted here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .peak import Peaks
from .roofline import non_embedding_params


@dataclass(frozen=True)
class FlopModel:
    body: int  # N: non-embedding parameters
    head: int  # H: LM-head parameters (vocab x hidden)

    @classmethod
    def of(cls, model: torch.nn.Module) -> FlopModel:
        head = model.get_output_embeddings()
        return cls(non_embedding_params(model), 0 if head is None else head.weight.numel())

    def decode(self, tokens: int) -> int:
        return 2 * (self.body + self.head) * tokens

    def prefill(self, prompt_tokens: int, logits_rows: int) -> int:
        return 2 * self.body * prompt_tokens + 2 * self.head * logits_rows

    def train(self, positions: int, head_positions: int) -> int:
        return 6 * self.body * positions + 6 * self.head * head_positions


def phase_fields(name: str, flops: float, seconds: float | None, dtype: torch.dtype | None,
                 peaks: Peaks, bytes_moved: float | None = None) -> dict[str, Any]:
    """`{name}_gflops` (achieved) and `{name}_peak_frac` (over the peak of `dtype`, the dtype the
    phase's matmuls run in); None where the phase took no time or no peak is known for the dtype.
    `{name}_roofline_frac`: the phase's roofline time over its time, the roofline being the longer of
    its FLOPs at the matmul peak and `bytes_moved` at the memory bandwidth (the lower ceiling binds),
    and `{name}_bound` which of the two it is ("compute" or "memory"); both None where the phase
    counted no work (async can decode every timed batch during the warm-up)."""
    gflops = flops / seconds / 1e9 if seconds else None
    peak = peaks.of(dtype) if dtype is not None else None
    limits = {"compute": flops / (peak * 1e9) if peak else None,
              "memory": bytes_moved / (peaks.gbps * 1e9) if bytes_moved is not None and peaks.gbps else None}
    known = {k: v for k, v in limits.items() if v}
    bound = max(known, key=known.__getitem__) if known and seconds else None
    return {f"{name}_gflops": gflops, f"{name}_peak_frac": gflops / peak if gflops is not None and peak else None,
            f"{name}_roofline_frac": known[bound] / seconds if bound else None, f"{name}_bound": bound}


def dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")
