"""What crosses between host and device in an engine step without a host sync: metadata going up
(`upload`), each slot's liveness kept on the device (`SlotLimits`), the sampled tokens coming back
(`StepOutput`).

A copy from pageable memory (`torch.tensor(list, device="cuda")`) makes the host wait behind the
stream's queue; from pinned memory with `non_blocking=True` it is a true asynchronous DMA. Pinned
buffers come from PyTorch's caching host allocator, which records the copy's stream on the block and
hands it out again only after that copy completes, so dropping the tensor right after the call is
safe. A buffer from anywhere else (`cudaHostRegister`, numpy) lacks that guarantee: do not substitute one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sequence import Running


def upload(values: list[int] | list[list[int]], device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` (a list, or equal-length lists) as a tensor on `device`, copied asynchronously to a GPU."""
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
# The device clears `live` by the host's own end rule (EOS where the slot stops on EOS, else its length
# limit), so the next step can launch before the host reads a token (overlap). Limits and EOS flags go
# up at admission, the EOS ids once. `ended` is the rule's one place; it must agree with the host's
# `Scheduler._append` (tests/generation/test_engine_overlap.py).

class SlotLimits:
    """Per-slot length budget and EOS flag on the device: remaining (slots,) int64, tokens a slot
    may still sample; stop_on_eos (slots,) bool."""

    def __init__(self, num_slots: int, eos_ids: list[int], device: torch.device) -> None:
        self.remaining = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.stop_on_eos = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.eos = upload(sorted(set(eos_ids)), device)  # (E,), maybe empty: nothing ends on EOS

    def ended(self, tokens: torch.Tensor, remaining: torch.Tensor, stop_on_eos: torch.Tensor) -> torch.Tensor:
        """tokens (n,) just sampled, remaining (n,) after them -> (n,) bool: the sequence is over.
        A comparison with each EOS id, not `torch.isin`, whose sort a CUDA graph should not capture."""
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
        """A decode step sampled `tokens` for the slots `index`; clear `live` in place where they
        ended. Finished slots' budgets count on: admission resets them."""
        remaining = self.remaining[index] - 1
        self.remaining[index] = remaining
        live[index] = live[index] & ~self.ended(tokens, remaining, self.stop_on_eos[index])


# -- inflight ----------------------------------------------------------------------------------------
# One step's sampled tokens on their way to the host. With overlap the engine reads step t while t+1
# computes, so the output carries its own context: the sequences running at launch (a slot freed since
# may hold another), those it admitted (their first tokens lead), and the version. On CUDA an event
# recorded after the copy to pinned memory marks it done, and `wait` blocks on that alone.

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
