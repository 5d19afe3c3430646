"""`bench train --lora-rank R`: LoRA against full fine-tuning on the same shape and samples.

Each side does what the trainer does per update: forward + backward of every packed micro-batch
(chunked log-probs), then an AdamW step. Full fine-tuning holds fp32 master weights, their
gradients and Adam states, plus (with a KL term) a frozen reference copy in the compute dtype;
LoRA holds the base once, frozen in the compute dtype (bf16 on CUDA), and gradients and Adam
states for the adapters only; its reference is the base with the adapters off (no copy).

Reported per side: train tokens/s; trainer state bytes, summed over the actual tensors after the
first update (weights, gradients, optimizer states, the reference copy), on any device; on CUDA
also the peak allocated during an update above the resident state (activations). And the weight
sync's bytes per publish (full sync: every parameter; LoRA: the merged adapted matrices) with its
time, publish + apply into a generator copy in the generation dtype.
"""
from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...config import load_config
from ...models import resolve_dtype
from ...models.lora import trainable_parameters, wrap
from ...trainer.batching import MicroBatch, pack
from ...trainer.masters import compile_layers
from ...trainer.optim import adamw_kind
from ...weightsync.full import LoraSync, WeightSync
from .harness import (
    alternate,
    build_model,
    environment,
    max_peak,
    median_seconds,
    model_label,
    pick_device,
    pick_dtype,
    ratio,
)

LossFn = Callable[[nn.Module, MicroBatch], torch.Tensor]


class Side:
    """One contender: a model, its optimizer, and what it keeps besides (a reference copy)."""

    def __init__(self, model: nn.Module, ref_bytes: int, autocast: torch.dtype | None, loss: LossFn) -> None:
        self.model, self.ref_bytes, self.autocast, self.loss = model, ref_bytes, autocast, loss
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-6, **adamw_kind(self.params))

    def update(self, mbs: list[MicroBatch]) -> int:
        tokens = sum(mb.completion_tokens for mb in mbs)
        ctx = torch.autocast("cuda", dtype=self.autocast) if self.autocast else contextlib.nullcontext()
        for mb in mbs:
            with ctx:
                loss = self.loss(self.model, mb) / tokens
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)  # gradients stay allocated, as between a trainer's steps
        return sum(mb.real_tokens for mb in mbs)

    def state_bytes(self) -> int:
        """Weights + gradients + optimizer states + the reference copy, from the tensors themselves."""
        def size(t: torch.Tensor) -> int:
            return t.numel() * t.element_size()
        weights = sum(size(p) for p in self.model.parameters())
        grads = sum(size(p.grad) for p in self.params if p.grad is not None)
        states = sum(size(v) for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v))
        return weights + grads + states + self.ref_bytes


def build_sides(args: argparse.Namespace, device: torch.device, autocast: torch.dtype | None,
                loss: LossFn) -> tuple[Side, Side, Any]:
    """Full fine-tuning (fp32 master + a compute-dtype reference) and LoRA (frozen base in the
    compute dtype, as build.build_lora_models loads it); returns the PeftModel too."""
    compute = resolve_dtype("auto", device)
    full_model = build_model(args.model, torch.float32, device, args.seed).train()
    ref_bytes = sum(p.numel() for p in full_model.parameters()) * torch.empty(0, dtype=compute).element_size()
    alpha = args.lora_alpha or 2.0 * args.lora_rank
    config = load_config(overrides=[f"model.lora_rank={args.lora_rank}", f"model.lora_alpha={alpha}"]).model
    peft_model = wrap(build_model(args.model, compute, device, args.seed), config)
    lora_model = peft_model.get_base_model().train()
    if args.compile:  # the warm-up round waits for it
        compile_layers(full_model)
        compile_layers(lora_model)
    return Side(full_model, ref_bytes, autocast, loss), Side(lora_model, 0, autocast, loss), peft_model


def publish_runs(full: Side, lora: Side, gen: nn.Module) -> tuple[dict[str, Any], dict[str, int]]:
    """Publish + apply of each sync into one generator copy, and the bytes each moves."""
    syncs = {"full": WeightSync(full.model, gen), "lora": LoraSync(lora.model, gen)}
    version = iter(range(1, 10**9))

    def cycle(sync: WeightSync) -> int:
        sync.publish(next(version))
        sync.apply()
        return sync.bytes_per_publish
    return ({f"publish_{k}": (lambda s=s: cycle(s)) for k, s in syncs.items()},
            {k: s.bytes_per_publish for k, s in syncs.items()})


def run_lora(args: argparse.Namespace, loss: LossFn, make_samples: Callable[[int], list]) -> dict[str, Any]:
    """`loss`: the chunked log-prob loss of `bench train`; `make_samples(vocab)`: its synthetic samples."""
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    autocast = dtype if device.type == "cuda" and dtype != torch.float32 else None
    full, lora, peft_model = build_sides(args, device, autocast, loss)
    config = full.model.config
    packed = pack(make_samples(config.vocab_size), args.budget, config.pad_token_id or 0, device)
    trainable, total = trainable_parameters(lora.model)
    print(f"bench train --lora-rank {args.lora_rank}: {model_label(args.model)} on {device}, {args.samples} samples, "
          f"{len(packed)} packed micro-batches; LoRA trains {trainable:,} of {total:,} parameters", flush=True)
    runs = alternate({"full": lambda: full.update(packed), "lora": lambda: lora.update(packed)}, args.repeats, device)
    state = {"full": full.state_bytes(), "lora": lora.state_bytes()}
    for side in (full, lora):  # gradients and optimizer states are not needed to publish: make room for it
        side.optimizer = None
        side.model.zero_grad(set_to_none=True)
    gen = build_model(args.model, dtype, device, args.seed).eval()
    publishes, publish_bytes = publish_runs(full, lora, gen)
    pubs = alternate(publishes, args.repeats, device)
    result = {"bench": "train", "variant": "lora_vs_full", **environment(device), "model": model_label(args.model),
              "lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha or 2.0 * args.lora_rank,
              "autocast": str(autocast).replace("torch.", "") if autocast else None, "samples": args.samples,
              "prompt_len": args.prompt_len, "mean_len": args.mean_len, "budget": args.budget,
              "repeats": args.repeats, "micro_batches": len(packed), "trainable_params": trainable,
              "total_params": total}
    for name in ("full", "lora"):
        result[f"{name}_tok_s"] = runs[name][-1].result / median_seconds(runs[name])
        result[f"{name}_state_gb"] = state[name] / 1e9
        peak = max_peak(runs[name])
        result[f"{name}_step_peak_gb"] = None if peak is None else peak / 1e9
        result[f"{name}_publish_mb"] = publish_bytes[name] / 1e6
        result[f"{name}_publish_s"] = median_seconds(pubs[f"publish_{name}"])
    result["lora_vs_full_tok_s"] = ratio(result["lora_tok_s"], result["full_tok_s"])
    result["lora_vs_full_state"] = ratio(result["lora_state_gb"], result["full_state_gb"])
    result["lora_vs_full_publish_bytes"] = ratio(publish_bytes["lora"], publish_bytes["full"])
    del peft_model
    report(result)
    return result


def report(r: dict[str, Any]) -> None:
    for name, label in (("full", "full fine-tuning"), ("lora", f"LoRA r={r['lora_rank']}")):
        peak = r[f"{name}_step_peak_gb"]
        print(f"  {label:<17} {r[name + '_tok_s']:>10.0f} tok/s; trainer state {r[name + '_state_gb']:.3f} GB"
              + (f", update peak +{peak:.2f} GB" if peak is not None else "")
              + f"; publish {r[name + '_publish_mb']:.1f} MB in {1000 * r[name + '_publish_s']:.1f} ms")
    print(f"  LoRA / full       {r['lora_vs_full_tok_s']:.2f}x tok/s, {r['lora_vs_full_state']:.3f}x trainer "
          f"state, {r['lora_vs_full_publish_bytes']:.3f}x bytes per publish", flush=True)
