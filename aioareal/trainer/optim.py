"""Which AdamW the trainer runs: torch's `fused` (one kernel for the whole update, one pass over each
tensor; fastest on CUDA and the CPU) where every trained parameter is a floating tensor on one such
device, FSDP2's DTensors included (torch 2.13 shards `_fused_adamw_` pointwise); `foreach` for mixed
devices; `AdamWBf16Moments` with `train.optimizer_moments=bfloat16`: its two moments stored in bf16,
half of AdamW's state (docs/log/2026-11-memory.md).

Each step updates a moment in fp32 exactly as torch's AdamW does and writes it back rounded
stochastically (up with probability equal to the fraction of a bf16 step cut off), which is
unbiased. Round-to-nearest would not do: with 8 bits of mantissa, the second moment's update at
beta2 = 0.99 moves v by less than half a step for any g^2 within about 40% of v, so v would stop
following the gradients' scale (tests/trainer/test_bf16_moments.py).

The update runs over chunks of CHUNK elements, so its fp32 temporaries stay small and in cache. One
draw of CHUNK random values per parameter and step serves all its chunks and both moments: each
rounding is still unbiased, and a draw per value was most of the cost (docs/log/figures-from-code.md).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from ..config import AlgoConfig
from ..errors import UserError

FUSED_DEVICES = ("cuda", "cpu")


def adamw_kind(params: Iterable[torch.Tensor]) -> dict[str, bool]:
    """`{"fused": True}` or `{"foreach": True}`, to pass to `torch.optim.AdamW` for `params`."""
    params = list(params)
    # A DTensor's `.device` is its local shard's, which is where the fused kernel runs.
    kinds = {p.device.type for p in params}
    fused = len(kinds) == 1 and kinds <= set(FUSED_DEVICES) and all(torch.is_floating_point(p) for p in params)
    return {"fused": True} if fused else {"foreach": True}


def embedding_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The token embedding's weight and the head's, once each (one tensor where they are tied)."""
    found: list[torch.Tensor] = []
    for get in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, get, lambda: None)()
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and not any(weight is w for w in found):
            found.append(weight)
    return found


def freeze_embeddings(model: torch.nn.Module, algo: AlgoConfig) -> None:
    """algo.embedding_lr_scale=0: the embedding (and the head tied to it) take no gradient at all,
    which also spares the head's weight gradient, the largest matmul of a big-vocabulary backward."""
    if algo.embedding_lr_scale == 0:
        for weight in embedding_weights(model):
            weight.requires_grad_(False)


def param_groups(params: list[torch.Tensor], model: torch.nn.Module, algo: AlgoConfig) -> list[dict]:
    """One group at algo.lr, and the embedding's at algo.lr x algo.embedding_lr_scale where it differs."""
    slow = [p for p in params if any(p is w for w in embedding_weights(model))] if algo.embedding_lr_scale != 1 else []
    rest = [p for p in params if not any(p is w for w in slow)]
    groups = [{"params": rest, "lr": algo.lr}]
    return groups + [{"params": slow, "lr": algo.lr * algo.embedding_lr_scale}] if slow else groups


def build_optimizer(params: list[torch.Tensor], algo: AlgoConfig, moments: str, sharded: bool,
                    model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
    """The trainer's AdamW over `params`, its moments in fp32 (torch's) or bf16 (train.optimizer_moments)."""
    settings = {"lr": algo.lr, "betas": (0.9, algo.adam_beta2), "weight_decay": algo.weight_decay}
    groups = param_groups(params, model, algo) if model is not None else params
    if moments == "float32":
        return torch.optim.AdamW(groups, **settings, **adamw_kind(params))
    if sharded:  # FSDP2's sharded checkpoints are tested with torch's AdamW state only
        raise UserError("train.optimizer_moments=bfloat16 runs in one process; under torchrun use float32 "
                        "(FSDP2 already shards the moments across ranks)")
    return AdamWBf16Moments(groups, **settings)


# Adam moves each weight by about lr a step whatever its size, so what a learning rate does is lr
# relative to the weights' typical magnitude; past this bound pretrained models have collapsed
# (docs/log/2026-12-gemma3.md, docs/log/figures-from-code.md), and the run says so at start-up.
MAX_RELATIVE_STEP = 2.5e-4
# LoRA moves a low-rank product, not every weight: its useful rates run about ten times full
# fine-tuning's, and this project's LoRA runs on SmolLM2-135M held their entropy and answer length at
# 1.4e-3 (SFT, lr 2e-4) and 7e-4 (RL, lr 1e-4, 30 steps) of the typical weight
# (docs/log/2026-12-gsm8k.md), where full fine-tuning's bound would have warned.
LORA_STEP_FACTOR = 10.0


def typical_weight(model: torch.nn.Module) -> float:
    """Mean |w| over the model's matrices, the token embedding and an untied head left out."""
    embeddings = embedding_weights(model)
    total, count = 0.0, 0
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and not any(p is e for e in embeddings):
                total += float(p.detach().abs().float().sum())
                count += p.numel()
    return total / count if count else 0.0


def relative_step_warning(model: torch.nn.Module, lr: float, lora: bool = False) -> str | None:
    """One line when `lr` is past MAX_RELATIVE_STEP of the model's typical weight (pretrained models),
    LORA_STEP_FACTOR times that with `lora` (adapters trained, the base frozen)."""
    typical = typical_weight(model)
    bound = MAX_RELATIVE_STEP * (LORA_STEP_FACTOR if lora else 1.0)
    if typical <= 0 or lr / typical <= bound:
        return None
    moved = "the adapters by about lr a step, and past" if lora else "every weight by about lr a step, and past"
    return (f"warning: algo.lr={lr:g} is {lr / typical:.1e} of this model's typical weight (mean |w| {typical:.3f}); "
            f"Adam moves {moved} {bound:g} of it pretrained models have collapsed within a few steps: "
            f"try algo.lr={typical * bound / 2:.0e}")


CHUNK = 1 << 18  # elements per slice of a parameter in the update: 1 MB of fp32 per temporary, in cache
LOW_BITS = 1 << 16  # fp32 bits below bf16's mantissa
HIGH_MASK = -LOW_BITS  # 0xFFFF0000 as an int32: keeps sign, exponent and bf16's 7 mantissa bits


def random_low_bits(like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Uniform int32 values in [0, 2^16), shaped like `like`: the bits a rounding cuts off."""
    return torch.empty(like.shape, dtype=torch.int32, device=like.device).random_(0, LOW_BITS, generator=generator)


def round_stochastically(x: torch.Tensor, out: torch.Tensor, noise: torch.Tensor) -> None:
    """Write fp32 `x` into bf16 `out` (overwriting `x`), rounded stochastically: adding `noise` to the
    bit pattern and cutting the low 16 bits does that for either sign (sign and magnitude), a carry
    into the exponent included, and leaves a value the cast to bf16 keeps exactly."""
    out.copy_(x.view(torch.int32).add_(noise).bitwise_and_(HIGH_MASK).view(torch.float32))


class AdamWBf16Moments(torch.optim.Optimizer):
    """torch.optim.AdamW's update with exp_avg and exp_avg_sq kept in bf16, and AdamW's state_dict keys.
    The rounding noise of parameter i at step t comes from a generator seeded with (seed, t, i), not
    the process's RNG: a resumed run rounds as the uninterrupted one, and sampling is unaffected."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, seed: int = 0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader casts the moments to the parameters' fp32: back to bf16, exactly."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(torch.bfloat16)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group, index)
                index += 1
        return loss

    def _generator(self, device: torch.device, step: float, index: int) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device)
        generator = self._generators[device]
        generator.manual_seed((self.seed * 1_000_003 + int(step)) * 100_003 + index)
        return generator

    def _update(self, p: torch.Tensor, group: dict, index: int) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)  # on the CPU, as torch's AdamW keeps it: reading it syncs nothing
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.bfloat16, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.bfloat16, memory_format=torch.contiguous_format)
        state["step"] += 1
        step = float(state["step"])
        lr, (beta1, beta2), eps = float(group["lr"]), group["betas"], group["eps"]
        step_size = lr / (1 - beta1 ** step)
        root_correction = math.sqrt(1 - beta2 ** step)
        generator = self._generator(p.device, step, index)
        if group["weight_decay"]:
            p.mul_(1 - lr * group["weight_decay"])
        flat = zip(p.view(-1).split(CHUNK), p.grad.reshape(-1).split(CHUNK),
                   state["exp_avg"].view(-1).split(CHUNK), state["exp_avg_sq"].view(-1).split(CHUNK))
        noise = random_low_bits(p.view(-1)[:CHUNK], generator)
        for weight, grad, avg16, sq16 in flat:
            grad = grad.float()
            avg = avg16.float().lerp_(grad, 1 - beta1)
            sq = sq16.float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            # sqrt(v) / root_correction + eps, with the division folded into the step's scale
            weight.addcdiv_(avg, sq.sqrt().add_(eps * root_correction), value=-step_size * root_correction)
            round_stochastically(avg, avg16, noise[:avg.numel()])
            round_stochastically(sq, sq16, noise[:sq.numel()])
