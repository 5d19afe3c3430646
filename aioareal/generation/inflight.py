"""One engine step's sampled tokens on their way to the host, with what the host needs to read them.

Without overlap the engine reads a step's tokens right after launching it (one blocking `.cpu()`).
With overlap (engine.py) it launches step t+1 first and reads step t's tokens while t+1 computes,
so a step's output must carry its own context: which sequences were running when it was launched
(a slot freed since may already belong to another sequence), which were admitted by it (their
first tokens lead the output), and the policy version that produced it.

On CUDA the copy goes device -> pinned host memory, non-blocking, and an event recorded after it
on the engine's stream marks it done: `wait` blocks on that event alone, not on the work queued
behind it. The pinned buffer comes from PyTorch's caching host allocator, which records the copy's
stream on it, so a record dropped unread (its sequences all finished) cannot have its buffer
reused under a copy still in flight. On the CPU, where ops are synchronous, the output is already
host memory and nothing is copied.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sequence import Running


@dataclass(slots=True)
class StepOutput:
    host: torch.Tensor  # (2, len(admitted) + decoded slots) float32 on the host: tokens, logprobs
    event: torch.cuda.Event | None  # the copy's completion, None on the CPU
    admitted: list[Running]  # sequences this step admitted, in the order of their first tokens
    running: list[Running]  # sequences running when the step was launched (admitted ones included)
    version: int  # policy version of the weights that produced these tokens
    decoded: bool  # whether the step decoded (its second part is one column per slot [0, n))

    def wait(self) -> None:
        """Block until the tokens are in host memory: a host sync on this step's copy only."""
        if self.event is not None:
            self.event.synchronize()


def to_host(out: torch.Tensor, stream: torch.cuda.Stream | None) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Start copying `out` (2, m) to the host without waiting; on the CPU return it as it is."""
    if out.device.type != "cuda":
        return out, None
    host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
    host.copy_(out, non_blocking=True)
    event = torch.cuda.Event()
    event.record(stream)
    return host, event
