"""Published specifications of the GPUs profiles are derived for, and the derivation: every cost of
a base profile is a sum of parts, each bound by memory bandwidth, tensor FLOPs or neither (kernel
launch latency, host Python); a derived profile scales each part by the base-to-target ratio of
its bound. A base profile without a breakdown (a measured one) is split by the default bounds
below. This is a roofline-style estimate: it ignores cache sizes, clocks, kernel choices and
occupancy, which is why derived profiles say `kind: derived` and list every factor they used.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from ...errors import UserError
from .cost_profile import Profile


@dataclass(frozen=True)
class GPU:
    name: str
    bandwidth_gbps: float  # HBM/GDDR bandwidth, GB/s
    tflops: float  # dense bf16 tensor TFLOP/s with fp32 accumulate (fp16 where there is no bf16)
    link_gbps: float  # GPU-to-GPU GB/s per direction in a typical box
    link: str
    dtype: str  # what the generator runs in: bf16, or fp16 where the GPU has no bf16
    source: str


GPUS: dict[str, GPU] = {
    "h100": GPU("NVIDIA H100 SXM5 80GB", 3350, 989, 450, "NVLink 4 (900 GB/s both directions)", "bfloat16",
                "NVIDIA H100 datasheet: 3.35 TB/s HBM3, 989 TFLOPS bf16 dense"),
    "a100": GPU("NVIDIA A100 SXM4 80GB", 2039, 312, 300, "NVLink 3 (600 GB/s both directions)", "bfloat16",
                "NVIDIA A100 datasheet: 2,039 GB/s HBM2e, 312 TFLOPS bf16 dense"),
    "v100": GPU("NVIDIA V100 SXM2 32GB", 900, 125, 150, "NVLink 2 (300 GB/s both directions)", "float16",
                "NVIDIA V100 datasheet: 900 GB/s HBM2, 125 TFLOPS fp16 tensor; no bf16 (fp16 + loss scaling)"),
    "l4": GPU("NVIDIA L4 24GB", 300, 121, 25, "PCIe 4.0 x16 (~25 GB/s achieved)", "bfloat16",
              "NVIDIA L4 datasheet: 300 GB/s GDDR6, 121 TFLOPS bf16 dense (242 with sparsity)"),
    "rtx4090": GPU("NVIDIA GeForce RTX 4090 24GB", 1008, 165, 12, "PCIe 4.0 x16, no peer-to-peer (via host, "
                   "~12 GB/s)", "bfloat16", "Ada whitepaper: 1,008 GB/s GDDR6X, 165 TFLOPS bf16 dense with fp32 "
                   "accumulate (330 with fp16 accumulate)"),
}

# Which bound each coefficient falls under when a profile carries no breakdown of its own.
DEFAULT_BOUNDS = {"decode.a": "bandwidth", "decode.b": "bandwidth", "decode.c": "bandwidth",
                  "prefill.a": "latency", "prefill.b": "flops", "prefill.c": "flops",
                  "train.a": "bandwidth", "train.b": "flops", "publish_s": "bandwidth", "adopt_s": "bandwidth",
                  "reward_s": "latency"}


def get(profile: Profile, key: str) -> float:
    part, _, name = key.partition(".")
    return getattr(getattr(profile, part), name) if name else getattr(profile, part)


def put(profile: Profile, key: str, value: float) -> None:
    part, _, name = key.partition(".")
    if name:
        setattr(getattr(profile, part), name, value)
    else:
        setattr(profile, part, value)


def parts_of(profile: Profile) -> dict[str, list[dict]]:
    """Each coefficient as [{seconds, bound, source}, ...]: the profile's own breakdown, or one part
    under the default bound."""
    own = profile.derivation.get("components", {})
    return {key: own.get(key) or [{"seconds": get(profile, key), "bound": bound, "source": "whole coefficient"}]
            for key, bound in DEFAULT_BOUNDS.items()}


def base_gpu(profile: Profile) -> GPU:
    key = profile.derivation.get("gpu")
    if key not in GPUS:
        raise UserError(f"profile {profile.name}: deriving needs a base profile that names its GPU "
                        f"(derivation.gpu, one of {', '.join(GPUS)})")
    return GPUS[key]


def derive(base: Profile, target: str, base_path: str) -> Profile:
    """`base` scaled to GPU `target`: bandwidth-bound parts by the bandwidth ratio, FLOP-bound parts
    by the tensor-FLOPs ratio, latency- and host-bound parts unchanged."""
    if target not in GPUS:
        raise UserError(f"--gpu {target}: unknown (known: {', '.join(GPUS)})")
    src, dst = base_gpu(base), GPUS[target]
    factor = {"bandwidth": src.bandwidth_gbps / dst.bandwidth_gbps, "flops": src.tflops / dst.tflops,
              "latency": 1.0, "host": 1.0}
    out = copy.deepcopy(base)
    components: dict[str, list[dict]] = {}
    for key, parts in parts_of(base).items():
        scaled = [{**p, "seconds": p["seconds"] * factor[p["bound"]]} for p in parts]
        components[key] = scaled
        put(out, key, sum(p["seconds"] for p in scaled))
    for cost in (out.decode, out.prefill, out.train):
        cost.points = []  # the base's measurements are not this GPU's
    out.name = base.name.replace(base.derivation["gpu"], target, 1) if base.derivation["gpu"] in base.name \
        else f"{target}-{base.name}"
    out.kind, out.device, out.dtype, out.link_gbps = "derived", dst.name, dst.dtype, dst.link_gbps
    out.notes = [f"derived from {base_path} ({base.kind}: {base.device}) by scaling: bandwidth-bound parts x "
                 f"{factor['bandwidth']:.3f} ({src.bandwidth_gbps:g} -> {dst.bandwidth_gbps:g} GB/s), FLOP-bound "
                 f"parts x {factor['flops']:.3f} ({src.tflops:g} -> {dst.tflops:g} TFLOPS), latency/host parts "
                 "unchanged; contention factors kept from the base", f"{dst.name}: {dst.source}",
                 f"link: {dst.link}", *base.notes]
    out.derivation = {"from": base_path, "gpu": target, "factors": factor, "specs": {"base": src.__dict__,
                      "target": dst.__dict__}, "components": components}
    return out
