"""Host -> device copies of the engine's small per-step metadata (slots, lengths, prompt tokens)
without a host sync.

`torch.tensor(list, device="cuda")` copies from pageable host memory, and such a copy returns only
once the data has left the host buffer: the host waits behind whatever the stream has queued. A copy
from page-locked (pinned) memory with `non_blocking=True` is a true asynchronous DMA: the host goes
on launching the step's kernels while the copy is in flight, ordered on the current stream.

Lifetime of the pinned buffer: each call builds a fresh pinned tensor with PyTorch's caching host
allocator, and a non-blocking copy out of such a buffer records an event on the current stream.
When the Python tensor dies (right after the call returns) the block goes back to the allocator's
cache, and the allocator hands it out again only once that event has completed, so the copy can
never read memory that a later call has overwritten. A buffer from anywhere else (a tensor pinned
by `cudaHostRegister`, numpy) would not carry that guarantee; do not substitute one.

On the CPU there is nothing to pin: the result is a plain tensor built in place.
"""
from __future__ import annotations

import torch


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
