"""CUDA graphs for decode steps, captured lazily per (batch bucket, attention span).

A replay runs the whole decode (layers, sampling, state update) in one launch; without it launch
latency dominates small-model decoding. Graphs hold raw pointers, so everything they read lives in
persistent buffers and weight sync copies in place (docs/architecture.md rule 5).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

# Capture in thread-local mode: the trainer thread keeps launching its own work meanwhile.
CAPTURE_MODE = "thread_local"


def can_use_own_generator() -> bool:
    """Graphs can draw from a private generator only where PyTorch can register it with a graph."""
    return hasattr(torch.cuda.CUDAGraph, "register_generator_state")


class DecodeGraphs:
    def __init__(self, decode: Callable[[int, int], torch.Tensor], generator: torch.Generator | None,
                 num_slots: int, state: list[torch.Tensor]) -> None:
        self.decode = decode
        self.generator = generator
        self.ladder = sorted({min(num_slots, 1 << i) for i in range(num_slots.bit_length() + 1)})
        self.state = state  # tensors a warm-up run mutates, restored before capture
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def bucket(self, n: int) -> int:
        return next(b for b in self.ladder if b >= n)

    def run(self, n: int, span: int) -> torch.Tensor:
        key = (self.bucket(n), span)
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        graph, out = self.graphs[key]
        graph.replay()
        return out

    def _capture(self, batch: int, span: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # An eager warm-up lets kernels pick their algorithms outside the capture. It writes the K/V
        # the replay writes again; the decode state and the RNG are restored, so a seeded run samples
        # the same tokens with graphs as without.
        saved = [t.clone() for t in self.state]
        rng = self.generator.get_state() if self.generator is not None else torch.cuda.get_rng_state()
        self.decode(batch, span)
        for t, s in zip(self.state, saved):
            t.copy_(s)
        if self.generator is not None:
            self.generator.set_state(rng)
        else:
            torch.cuda.set_rng_state(rng)
        graph = torch.cuda.CUDAGraph()
        if self.generator is not None:
            graph.register_generator_state(self.generator)
        # A host sync: `torch.cuda.graph` synchronizes the device on entry. Once per new (batch
        # bucket, span) key, so a run pays it a handful of times while the span grows, then never.
        with torch.cuda.graph(graph, pool=self.pool, stream=torch.cuda.current_stream(),
                              capture_error_mode=CAPTURE_MODE):
            out = self.decode(batch, span)
        self.pool = graph.pool()
        return graph, out
