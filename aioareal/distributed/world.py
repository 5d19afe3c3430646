"""This process's place in a torchrun job, and the few collectives the run itself makes. Without
torchrun's variables this is the single-process cell: `World()`, rank 0 of 1, torch.distributed
never initialised.

Two process groups, each used from one thread at a time, in the same order on every rank: the
default group (NCCL on CUDA, gloo on the CPU) carries the trainer's tensors, on the trainer's thread
only; `control` (gloo) carries Python objects: start-up decisions (`main_decides`) and then each
step's report, stop decision and counters on a thread of its own (`RankHooks`), so waiting for other
ranks never blocks the event loop. Both time out after `dist.timeout_s` instead of hanging.

`shard_policy`: the trainer's model across ranks, FSDP2 (`fully_shard`), and the ways back to full weights
(docs/architecture.md#scale-out-rank-by-rank).

Every rank loads the whole policy, then `shard_policy` keeps 1/N of each parameter: one FSDP2 unit
per decoder layer and a root unit (`TokenLogprobs`: embeddings, final norm, head). Gradients are
summed across ranks, not averaged (divide factor 1): each rank's loss is already normalised by the
global counts, so the sum is the whole batch's gradient. Full weights come back by gathering, in the
same order on every rank: into the generator's staging buffer (weightsync), and into `Mirror`.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ..errors import UserError
from .env import rank_number

T = TypeVar("T")


class RankError(UserError):
    """A collective failed on this rank: another rank died, or stalled past dist.timeout_s (exit code 4)."""

    exit_code = 4


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    timeout_s: float = 300.0
    control: Any = None  # the gloo group for Python objects; None in a single process

    @property
    def distributed(self) -> bool:
        return self.control is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.control)

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order (pickled over the control group)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def main_decides(self, fn: Callable[[], T]) -> T:
        """Run `fn` on rank 0 only and hand every rank its result, so a decision that reads or changes
        the run directory is made once. A user error on rank 0 is raised on every rank."""
        if not self.distributed:
            return fn()
        box: list[Any] = [None]
        if self.is_main:
            try:
                box[0] = ("ok", fn())
            except UserError as e:
                box[0] = ("error", str(e), e.exit_code)
            except BaseException as e:
                box[0] = ("error", f"rank 0 failed: {type(e).__name__}: {e}", 1)
                dist.broadcast_object_list(box, src=0, group=self.control)
                raise
        dist.broadcast_object_list(box, src=0, group=self.control)
        if box[0][0] == "ok":
            return box[0][1]
        error = UserError(box[0][1])
        error.exit_code = box[0][2]
        raise error


_current = World()


def current() -> World:
    """The world of this process (rank 0 of 1 until `init` ran)."""
    return _current


def init(timeout_s: float, backend: str = "auto", device: torch.device | None = None) -> World:
    """Join the job torchrun started; `device` is this rank's trainer device (NCCL binds to it)."""
    global _current
    if backend == "auto":
        backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if backend == "nccl":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        dist.init_process_group(backend, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout)
    _current = World(dist.get_rank(), dist.get_world_size(), rank_number("LOCAL_RANK"), timeout_s, control)
    return _current


def teardown(clean: bool) -> None:
    """Leave the job; after a clean run the ranks meet once more, so none exits while another writes."""
    global _current
    if not _current.distributed:
        return
    if clean:
        _current.barrier()
        dist.destroy_process_group()
    _current = World()


def is_collective_failure(error: BaseException) -> bool:
    """An error from a collective (a peer gone, a timeout), as opposed to a bug or a user error."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        word in text for word in ("gloo", "nccl", "connection closed", "connection reset", "timed out", "timeout"))


def rank_error(world: World, error: BaseException) -> RankError:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    return RankError(f"rank {world.rank} of {world.size}: a collective with the other ranks failed ({first}); "
                     f"another rank died or stalled longer than dist.timeout_s={world.timeout_s:g} s (torchrun's "
                     "summary names the rank that failed first). Continue from the last checkpoint with "
                     "--resume RUN_DIR")


# -- global reductions for the trainer: what makes a step on N ranks the step on one ------------------
# The loss normalisers, the step's statistics and the micro-batch counts are summed (or maximised)
# over ranks. `LOCAL` changes nothing; `Global` all-reduces over the default group through the
# trainer's device (which NCCL needs).
class Collective(Protocol):
    size: int  # ranks taking part

    def sum_(self, values: torch.Tensor) -> torch.Tensor: ...
    def max_(self, values: torch.Tensor) -> torch.Tensor: ...


class Local:
    """One process: every reduction is the identity."""

    size = 1

    def sum_(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def max_(self, values: torch.Tensor) -> torch.Tensor:
        return values


LOCAL = Local()


class Global:
    """All-reduce over the default process group, in place; returns `values`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.size = dist.get_world_size()

    def _reduce(self, values: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
        on_device = values.to(self.device)
        dist.all_reduce(on_device, op=op)
        if on_device is not values:
            values.copy_(on_device)
        return values

    def sum_(self, values: torch.Tensor) -> torch.Tensor:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max_(self, values: torch.Tensor) -> torch.Tensor:
        return self._reduce(values, dist.ReduceOp.MAX)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a Hugging Face model: the classes it names in `_no_split_modules`."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise UserError(f"cannot shard {type(model).__name__} under torchrun: its class names no decoder layer "
                        "class in _no_split_modules")
    return layers


def mixed_precision(device: torch.device, compute_dtype: torch.dtype) -> MixedPrecisionPolicy:
    """bf16 parameters with fp32 gradient reduction on CUDA; fp16 (V100) keeps fp32 parameters under
    autocast with its loss scaler; the CPU computes in fp32."""
    if device.type == "cuda" and compute_dtype == torch.bfloat16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def shard_policy(policy: nn.Module, model: nn.Module, device: torch.device, compute_dtype: torch.dtype) -> None:
    """Shard `policy` (the `TokenLogprobs` around `model`) in place over the default process group."""
    mp = mixed_precision(device, compute_dtype)
    units = []
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp)
        units.append(layer)
    fully_shard(policy, mp_policy=mp)
    for unit in [*units, policy]:
        assert isinstance(unit, FSDPModule)
        unit.set_gradient_divide_factor(1.0)  # the ranks' gradients add up (see the module docstring)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: gathered from every rank when it is a shard (a collective), else itself."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


class Mirror:
    """A plain, unsharded copy of the trainer's model, refreshed from the shards on demand, for held-out
    evaluation's engine (whose step counts differ between ranks) and rank 0's export."""

    def __init__(self, model: nn.Module) -> None:
        """`model` not yet sharded: the copy starts with its weights."""
        self.model = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def refresh(self, sharded: nn.Module) -> nn.Module:
        """Gather every parameter of `sharded` into the copy (a collective: every rank calls it)."""
        for source, target in zip(sharded.parameters(), self.model.parameters()):
            target.copy_(full_tensor(source))
        return self.model
