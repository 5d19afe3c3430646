"""models/ops.py: the lean RMSNorm and SwiGLU compute what the model's own modules do,
keep less for the backward, and a module whose own forward differs keeps it."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from aioareal.models import random_model
from aioareal.models.ops import _RMSNorm, _SwiGLU, make_lean

CPU = torch.device("cpu")


def _saved_bytes(fn) -> tuple[int, torch.Tensor]:
    """Bytes autograd keeps for the backward of fn() (distinct storages, leaves excluded), and its output."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not (t.requires_grad and t.is_leaf):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(seen.values()), out


def _grads(model: nn.Module, ids: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        hidden = model.model(input_ids=ids).last_hidden_state
    hidden.float().pow(2).mean().backward()
    return hidden.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def test_every_norm_and_mlp_of_the_tiny_model_turns_lean_and_computes_the_same():
    own, lean = (random_model("tiny", torch.float32, CPU, seed=0) for _ in range(2))
    layers = len(own.model.layers)
    assert make_lean(lean) == 3 * layers + 1  # two norms and an MLP per layer, and the final norm
    ids = torch.randint(4, 100, (3, 17), generator=torch.Generator().manual_seed(1))
    for autocast, tol in ((False, 1e-5), (True, 2e-2)):
        for m in (own, lean):
            m.zero_grad(set_to_none=True)
        out_own, g_own = _grads(own, ids, autocast)
        out_lean, g_lean = _grads(lean, ids, autocast)
        assert torch.equal(out_own, out_lean)  # the forward, op for op
        assert float((g_own - g_lean).norm() / g_own.norm()) < tol


def test_the_lean_layers_keep_less_for_the_backward():
    own, lean = (random_model("tiny", torch.float32, CPU, seed=0) for _ in range(2))
    make_lean(lean)
    ids = torch.randint(4, 100, (4, 64), generator=torch.Generator().manual_seed(2))
    kept_own, _ = _saved_bytes(lambda: own.model(input_ids=ids).last_hidden_state)
    kept_lean, _ = _saved_bytes(lambda: lean.model(input_ids=ids).last_hidden_state)
    # Per position, in fp32: each norm's normalised copy (hidden) and each MLP's silu(gate) (intermediate).
    c = own.config
    per_position = c.num_hidden_layers * (2 * c.hidden_size + c.intermediate_size) + c.hidden_size
    assert kept_own - kept_lean == ids.numel() * per_position * 4


class _OnePlusNorm(nn.Module):
    """A norm written Gemma's way, weight * (1 + w): the lean norm must not take it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.randn(width) * 0.1), 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (normed * (1 + self.weight)).to(x.dtype)


class _GeluMlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(width, 8), nn.Linear(width, 8), nn.Linear(8, width)
        self.act_fn = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_a_module_whose_own_forward_differs_keeps_it():
    model = nn.Sequential(_OnePlusNorm(6), _GeluMlp(6))
    assert make_lean(model) == 0
    assert all("forward" not in vars(m) for m in model)


def test_a_deep_copy_of_a_lean_model_runs_its_own_modules():
    import copy
    model = random_model("tiny", torch.float32, CPU, seed=0)
    make_lean(model)
    twin = copy.deepcopy(model)
    norm = twin.model.norm
    assert norm.forward.__self__ is norm  # bound to the copy, not to the original's module


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 4), width=st.integers(2, 9), eps=st.sampled_from([1e-6, 1e-5, 0.1]))
def test_the_hand_written_backwards_pass_gradcheck(rows: int, width: int, eps: float):
    draws = torch.Generator().manual_seed(rows * 100 + width)
    x = torch.randn(rows, width, dtype=torch.float64, generator=draws, requires_grad=True)
    w = torch.randn(width, dtype=torch.float64, generator=draws, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: _RMSNorm.apply(a, b, eps), (x, w))
    gate = torch.randn(rows, width, dtype=torch.float64, generator=draws, requires_grad=True)
    assert torch.autograd.gradcheck(_SwiGLU.apply, (gate, x))
