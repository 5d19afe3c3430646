"""The memory-bandwidth roofline of decoding: every decode step must read all parameters once and
each sequence's KV cache up to its context, so tokens/s <= peak bandwidth / bytes per token.

bytes per step = parameter bytes + batch * average context * KV bytes per token
achieved bytes/s = (tokens/s / batch) * bytes per step

(docs/architecture.md#reference-facts: Qwen2.5-0.5B in bf16 reads 0.99 GB of weights and 12,288 bytes of KV cache
per token of context; an H100 at 3.35 TB/s tops out near 120k tokens/s at batch 64, 1k context.)

Training is bounded by compute instead. Model-FLOPs utilisation (Kaplan et al. 2020, sec. 2.1;
PaLM, Chowdhery et al. 2022, app. B): a forward and backward pass costs about 6 FLOPs per
non-embedding parameter per token, so MFU = 6 x N x tokens/s / peak FLOPs. N leaves out the
embedding table and the LM head (tied or not): a lookup costs no FLOPs, and the trainer's chunked
log-probs run the head over completion positions only. Attention's context-length term is left out too, so
MFU here is a lower bound on the work the device did.
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
    return _lookup(device, PEAK_GBPS)


# Peak dense bf16 tensor-core throughput in TFLOPS (vendor data sheets, no sparsity). Matched in
# order on the device name; the PCIe H100 comes before the SXM part, whose name says only "H100".
PEAK_BF16_TFLOPS: list[tuple[tuple[str, ...], float]] = [
    (("H200",), 989.0),
    (("H100", "PCIe"), 756.0),
    (("H100",), 989.0),
    (("A100",), 312.0),
]


def _lookup(device: torch.device, table: list[tuple[tuple[str, ...], float]]) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((value for keys, value in table if all(k in name for k in keys)), None)


def peak_bf16_tflops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, or None when it is not in the table (pass --peak-tflops)."""
    return _lookup(device, PEAK_BF16_TFLOPS)


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters outside the input and output embeddings (tied ones counted once)."""
    skip = {id(model.get_input_embeddings().weight)}
    head = model.get_output_embeddings()
    if head is not None:
        skip.add(id(head.weight))
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def mfu(params: int, tokens_per_s: float, peak_tflops: float) -> float:
    """Model-FLOPs utilisation of a training pass: 6 x params x tokens/s over the peak."""
    return 6 * params * tokens_per_s / (peak_tflops * 1e12)


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
