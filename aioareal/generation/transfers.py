"""What crosses between host and device in an engine step, without a host sync: the step's metadata
going up (`upload`), each slot's liveness kept on the device (`SlotLimits`), and the sampled tokens
coming back (`StepOutput`).

`torch.tensor(list, device="cuda")` copies from pageable host memory, and such a copy returns only
once the data has left the host buffer: the host waits behind whatever the stream has queued. A copy
from page-locked (pinned) memory with `non_blocking=True` is a true asynchronous DMA: the host goes
on launching the step's kernels while the copy is in flight, ordered on the current stream.

Lifetime of the pinned buffer: each call builds a fresh pinned tensor with PyTorch's caching host
allocator, and a non-blocking copy out of such a buffer records an event on the current stream.
When the Python tensor dies (right after the call returns) the block goes back to the allocator's
cache, and the allocator hands it out again only once that event has completed, so the copy can
never read memory that a later call has overwritten. A buffer from anywhere else (a tensor pinned
by `cudaHostRegister`, numpy) would not carry that guarantee; do not substitute one. On the CPU
there is nothing to pin: the result is a plain tensor built in place.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sequence import Running


def upload(values: list[int] | list[list[int]], device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (a list, or a list of equal-length lists) as a tensor on `device`, copied
    asynchronously when `device` is a GPU."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    host = torch.tensor(values, dtype=dtype, pin_memory=True)  # the caching host allocator's block
    return host.to(device, non_blocking=True)


def upload_padded(rows: list[list[int]], device: torch.device, pad: int = 0) -> torch.Tensor:
    """Right-pad token rows to the longest with `pad`: (len(rows), longest) on `device`, uploaded as
    `upload` does (one host tensor, one copy, whatever the number of rows)."""
    width = max(len(r) for r in rows)
    return upload([r + [pad] * (width - len(r)) for r in rows], device)


# -- liveness ----------------------------------------------------------------------------------------
# Which slots are still generating, decided on the device from the tokens it just sampled.
#
# The host's bookkeeping decides when a sequence ends (an EOS token where it stops on EOS, else its
# length limit) and records why. The device applies the same rule to clear `live` itself, so the
# next decode step can be launched before the host has read a single token (the engine's overlap,
# engine.py): each slot's remaining length and whether it stops on EOS go up once, at admission,
# with the prompt's other metadata; the EOS ids go up once, when the engine is built.
#
# The rule is kept in one place, `ended`, and it must agree with the host's `Engine._append`
# (tests/generation/test_engine_overlap.py checks that the device's `live` equals the host's running set after
# every step of a plain engine).

class SlotLimits:
    """Per-slot length budget and EOS flag on the device: remaining (slots,) int64, tokens a slot
    may still sample; stop_on_eos (slots,) bool."""

    def __init__(self, num_slots: int, eos_ids: list[int], device: torch.device) -> None:
        self.remaining = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.stop_on_eos = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.eos = upload(sorted(set(eos_ids)), device)  # (E,), maybe empty: nothing ends on EOS

    def ended(self, tokens: torch.Tensor, remaining: torch.Tensor, stop_on_eos: torch.Tensor) -> torch.Tensor:
        """tokens (n,) just sampled, remaining (n,) after them -> (n,) bool: the sequence is over.
        A comparison against every EOS id rather than `torch.isin`, whose sort-based path is not
        something a CUDA graph should have to capture; E is a handful of ids."""
        is_eos = (tokens[:, None] == self.eos[None, :]).any(dim=-1)
        return (remaining <= 0) | (stop_on_eos & is_eos)

    def start(self, slots: torch.Tensor, first: torch.Tensor, limits: torch.Tensor,
              stop_on_eos: torch.Tensor) -> torch.Tensor:
        """Admission: slots (m,) take their limits and EOS flags; returns their liveness (m,) after
        the first tokens `first` (m,) sampled from the prefill."""
        remaining = limits - 1
        self.remaining[slots] = remaining
        self.stop_on_eos[slots] = stop_on_eos
        return ~self.ended(first, remaining, stop_on_eos)

    def advance(self, live: torch.Tensor, tokens: torch.Tensor, index: slice | torch.Tensor) -> None:
        """A decode step sampled `tokens` for the slots `index` (a slice or an index tensor); clear
        `live` (the engine's (slots,) tensor, updated in place) where they ended. Finished slots'
        budgets keep counting down: nothing reads them until admission resets them."""
        remaining = self.remaining[index] - 1
        self.remaining[index] = remaining
        live[index] = live[index] & ~self.ended(tokens, remaining, self.stop_on_eos[index])


# -- inflight ----------------------------------------------------------------------------------------
# One engine step's sampled tokens on their way to the host, with what the host needs to read them.
#
# Without overlap the engine reads a step's tokens right after launching it (one blocking `.cpu()`).
# With overlap (engine.py) it launches step t+1 first and reads step t's tokens while t+1 computes,
# so a step's output must carry its own context: which sequences were running when it was launched
# (a slot freed since may already belong to another sequence), which were admitted by it (their
# first tokens lead the output), and the policy version that produced it.
#
# On CUDA the copy goes device -> pinned host memory, non-blocking, and an event recorded after it
# on the engine's stream marks it done: `wait` blocks on that event alone, not on the work queued
# behind it. The pinned buffer comes from PyTorch's caching host allocator, which records the copy's
# stream on it, so a record dropped unread (its sequences all finished) cannot have its buffer
# reused under a copy still in flight. On the CPU, where ops are synchronous, the output is already
# host memory and nothing is copied.

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
