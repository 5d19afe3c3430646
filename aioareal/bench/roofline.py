"""The memory-bandwidth roofline of decoding: every decode step must read all parameters once and
each sequence's KV cache up to its context, so tokens/s <= peak bandwidth / bytes per token.

bytes per step = parameter bytes + batch * average context * KV bytes per token
achieved bytes/s = (tokens/s / batch) * bytes per step

(DESIGN reference facts: Qwen2.5-0.5B in bf16 reads 0.99 GB of weights and 12,288 bytes of KV cache
per token of context; an H100 at 3.35 TB/s tops out near 120k tokens/s at batch 64, 1k context.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# Peak HBM bandwidth in GB/s (vendor data sheets, SXM parts). Matched in order on the device name.
PEAK_GBPS: list[tuple[tuple[str, ...], float]] = [
    (("H200",), 4800.0),
    (("H100",), 3350.0),
    (("A100", "80GB"), 2039.0),
    (("A100",), 1555.0),
]


def peak_gbps(device: torch.device) -> float | None:
    """The device's peak memory bandwidth, or None when it is not in the table (pass --peak-gbps)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for keys, gbps in PEAK_GBPS:
        if all(k in name for k in keys):
            return gbps
    return None


@dataclass(frozen=True)
class Roofline:
    param_bytes: int
    kv_bytes_per_token: int
    batch: int  # sequences decoded per step
    avg_context: float  # average tokens of context attended per sequence over the run

    @property
    def bytes_per_step(self) -> float:
        return self.param_bytes + self.batch * self.avg_context * self.kv_bytes_per_token

    def achieved_gbps(self, tokens_per_s: float) -> float:
        return tokens_per_s / self.batch * self.bytes_per_step / 1e9

    def ceiling_tokens_per_s(self, peak_gbps: float) -> float:
        """The most tokens/s that bandwidth allows at this batch and context."""
        return peak_gbps * 1e9 / self.bytes_per_step * self.batch
