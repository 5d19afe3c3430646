"""Which decode path the engine takes: small rules kept apart from the engine so the simulator
(simulate/costed_workers.py) follows the same ones."""
from __future__ import annotations

from collections.abc import Callable

import torch

from .fused_sampling import fused_sample
from .inverse_cdf import inverse_cdf_sample
from .sampling import sample

# With CUDA graphs the attention span is rounded up to a bucket so few graphs are captured;
# eager decoding attends over exactly the live context.
GRAPH_SPAN_BUCKET = 64
# Attention spans up to which the CPU's decode of the live slots alone pays at any live count.
SHORT_SPAN = 32


def live_decode_pays(live: int, n: int, span: int) -> bool:
    """Whether the CPU decodes only the `live` running slots of the first n (engine._decode_live)
    rather than all n. Gathering the live slots' cache rows costs about what attention over them
    does, so it pays when contexts are short (the gather is cheap) or at least half the slots are
    done (the attention saved outweighs the gather); with most slots still live over a long context
    the gather costs more than it saves."""
    return live < n and (span <= SHORT_SPAN or 2 * live <= n)


def resolve_overlap(overlap: bool | str, device: torch.device) -> bool:
    """`overlap` as the config gives it (true, false or "auto") -> whether the engine overlaps.
    Auto is on for CUDA only: on the CPU ops are synchronous, so there is no device to keep busy."""
    if overlap == "auto":
        return device.type == "cuda"
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap must be true, false or 'auto', got {overlap!r}")
    return overlap


def sampler_for(device: torch.device, fused: bool) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The compiled exponential race where asked (fused_sampling.py); else on the CPU the inverse-CDF
    draw, one random number per row (inverse_cdf.py: the race's one draw per word costs more than
    the LM head there), and on a GPU the race, whose per-word draws are parallel and cheap."""
    if fused:
        return fused_sample
    return inverse_cdf_sample if device.type == "cpu" else sample
