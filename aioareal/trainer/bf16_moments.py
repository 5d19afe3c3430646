"""AdamW with its two moments stored in bf16 (train.optimizer_moments=bfloat16): half of AdamW's
state, 0.54 GB of a 135M-parameter model's 1.08 GB (docs/log/2026-11-memory.md).

Each step reads a moment into fp32, updates it there exactly as torch's AdamW does, and writes it
back rounded stochastically: rounded up with probability equal to the fraction of a bf16 step
that was cut off. Round-to-nearest would not do. bf16 keeps 8 bits of mantissa (a step of 1/128
to 1/256 of the value), and the second moment's update `v <- v + (1 - beta2) * (g^2 - v)` moves v
by 1% of its distance to g^2 at beta2 = 0.99: any g^2 within about 40% of v moves it by less than
half a step, so rounded to nearest v would stop following the gradients' scale
(tests/trainer/test_bf16_moments.py shows it). Stochastic rounding is unbiased, so the moments
move in expectation as the fp32 ones do. Weights and gradients keep their own dtype (fp32 masters).

The update runs over chunks of each parameter (CHUNK elements), so its fp32 temporaries stay
small beside the largest parameter (the 49k x 576 embedding: 113 MB in fp32) and in cache. One
draw of CHUNK random values per parameter and step serves all its chunks and both moments: each
value's rounding is still unbiased (its noise is uniform and independent of the value), and a
draw per value was most of the cost (timings: docs/log/figures-from-code.md).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

CHUNK = 1 << 18  # elements per slice of a parameter in the update: 1 MB of fp32 per temporary, in cache
LOW_BITS = 1 << 16  # fp32 bits below bf16's mantissa
HIGH_MASK = -LOW_BITS  # 0xFFFF0000 as an int32: keeps sign, exponent and bf16's 7 mantissa bits


def random_low_bits(like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Uniform int32 values in [0, 2^16), shaped like `like`: the bits a rounding cuts off."""
    return torch.empty(like.shape, dtype=torch.int32, device=like.device).random_(0, LOW_BITS, generator=generator)


def round_stochastically(x: torch.Tensor, out: torch.Tensor, noise: torch.Tensor) -> None:
    """Write fp32 `x` into bf16 `out` (overwriting `x`), each value rounded up in magnitude with
    probability equal to the fraction of a bf16 step it lies above the value below it. Adding
    `noise` (random_low_bits) to the bit pattern and cutting the low 16 bits off does that for
    either sign (the pattern is sign and magnitude); a carry into the exponent is the correct
    rounding up. The result's low bits are zero, so the final cast to bf16 is exact."""
    out.copy_(x.view(torch.int32).add_(noise).bitwise_and_(HIGH_MASK).view(torch.float32))


class AdamWBf16Moments(torch.optim.Optimizer):
    """torch.optim.AdamW's update (decoupled weight decay, bias correction, eps outside the root),
    with exp_avg and exp_avg_sq kept in bf16. Its state_dict has AdamW's keys, so checkpoints
    save and restore it as they do AdamW's. The rounding noise of parameter i at step t comes from
    a generator seeded with (seed, t, i), not from the process's RNG: a resumed run rounds exactly
    as the uninterrupted one, and sampling draws the same numbers with or without this optimizer."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, seed: int = 0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader casts floating state to each parameter's dtype (fp32): back to bf16, exactly
        (the values came from bf16)."""
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
