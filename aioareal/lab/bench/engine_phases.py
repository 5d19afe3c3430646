"""The engine's decode and prefill phases in `bench gen`: seconds per round from the engine's own
phase timer (timing.PhaseTimer: perf_counter on the CPU, a pair of CUDA events per phase and step
on CUDA, as in a run), their FLOPs (flops.py) and their fractions of the matmul peak (peak.py).

Per round of P prompts x G samples of a T-token prompt and `tokens` sampled: prefill runs P x T
prompt tokens and P x G logits rows (each prompt's last hidden state, once per sample), and
samples every sequence's first token; the decode steps sample the other tokens - P x G.
"""
from __future__ import annotations

from collections.abc import Callable
from statistics import median
from typing import Any, TypeVar

import torch

from ...generation import Engine
from .flops import FlopModel, phase_fields
from .peak import Peaks
from .roofline import Roofline

T = TypeVar("T")


class PhaseRounds:
    """Each timed call's seconds per engine phase (`decode`, `prefill`, ...)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.rounds: list[dict[str, float]] = []

    def wrap(self, fn: Callable[[], T]) -> Callable[[], T]:
        def call() -> T:
            self.engine.timer.take()  # drop what came before the call
            out = fn()
            self.rounds.append(self.engine.timer.take())
            return out
        return call

    def seconds(self, phase: str, skip: int = 1) -> float | None:
        """Median seconds of `phase` per call, after the first `skip` (alternate's warm-up round)."""
        kept = [r.get(phase, 0.0) for r in self.rounds[skip:]]
        return median(kept) if kept else None


def phase_figures(model: torch.nn.Module, rounds: PhaseRounds, prompts: int, samples: int, prompt_len: int,
                  tokens: int, dtype: torch.dtype, peaks: Peaks, roof: Roofline) -> dict[str, Any]:
    """`decode_*` and `prefill_*` fields of one round: tokens, median seconds, FLOPs, GFLOP/s, the
    fraction of the peak of `dtype` (the engine's weights' dtype) and of the phase's roofline.
    Bytes: a decode step reads the weights and every sequence's KV cache (`roof`, `roof.batch`
    sequences a step); prefill reads the weights once and writes the prompts' KV cache."""
    fm = FlopModel.of(model)
    sequences, prompt_tokens = prompts * samples, prompts * prompt_len
    decoded = tokens - sequences
    work = {"decode": (decoded, fm.decode(decoded), roof.bytes_per_step * decoded / roof.batch),
            "prefill": (prompt_tokens, fm.prefill(prompt_tokens, sequences),
                        roof.param_bytes + prompt_tokens * roof.kv_bytes_per_token)}
    out: dict[str, Any] = {}
    for phase, (count, flops, bytes_moved) in work.items():
        seconds = rounds.seconds(phase)
        out.update({f"{phase}_tokens": count, f"{phase}_s": seconds, f"{phase}_flops": flops})
        out.update(phase_fields(phase, flops, seconds, dtype, peaks, bytes_moved))
    return out
