"""Checkpoints of a run on several ranks: torch.distributed.checkpoint (DCP) for the sharded model
and optimizer state, the single-process layout for everything else.

    step-000040/
        shards/           .metadata + one __<rank>_0.distcp per rank: model and AdamW moments (DCP)
        policy/           the full policy in Hugging Face format (rank 0, from the gathered mirror)
        trainer.pt        scheduler, loss scaler, version, AdamW's settings (plain data, rank 0)
        rng.pt, rng-rank<r>.pt   each rank's RNG states (rank 0's under the single-process name)
        state.json        step, elapsed time, and each rank's cursor and ledger (`ranks`), last

Atomic as before: every rank writes into the same temporary directory (the run directory is on a
filesystem all ranks share), the ranks meet at a barrier, and rank 0 alone writes state.json and
renames the directory into place; a crash anywhere before the rename leaves the previous
checkpoint as it was. DCP reshards on load, so a run resumes on another number of ranks too (see
`rank_state` for the data cursor, the one approximate part).
"""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..distributed.world import Mirror, World
from ..errors import UserError
from . import atomic as checkpoint
from .atomic import SHARDS, RunState
from .safeload import SafeReader, load_plain


def rng_file(rank: int) -> str:
    return "rng.pt" if rank == 0 else f"rng-rank{rank}.pt"


def _barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()  # the default group: this runs on the trainer's thread, like every collective there


def save(run_dir: Path, state: RunState, trainer: Any, mirror: Mirror, tokenizer: Any, rng: dict[str, Any],
         keep: int, world: World) -> None:
    """Every rank calls this (on its trainer's thread); `state` is rank 0's with every rank's counters."""
    tmp = checkpoint.temp_dir(run_dir, state.step)
    with checkpoint.cleaned_on_failure(tmp, state.step):
        if world.is_main:
            checkpoint.begin(run_dir, state.step)
        _barrier(world)
        policy = mirror.refresh(trainer.model)  # collective: the full weights, for the export
        model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer)
        dcp.save({"model": model_state, "optim": optim_state["state"]}, checkpoint_id=tmp / SHARDS)  # collective
        torch.save(rng, tmp / rng_file(world.rank))
        if world.is_main:
            plain = {**trainer.counters(), "optimizer": {"param_groups": optim_state["param_groups"]}}
            checkpoint.write_policy(tmp, policy, tokenizer, plain)
        _barrier(world)  # every rank's files are in place
        if world.is_main:
            checkpoint.commit(run_dir, tmp, state, keep)
        _barrier(world)  # and renamed: no rank goes on before the checkpoint exists


def restore(path: Path, trainer: Any, engine: Any, world: World, local_batch: int) -> RunState:
    """Continue from sharded checkpoint `path` on this rank: model and optimizer shards (resharded
    by DCP when the number of ranks changed), schedule, version, this rank's RNG and counters."""
    state = checkpoint.load_state(path)
    if not (path / SHARDS).is_dir():
        raise UserError(f"{path} was written by a single process; resume it without torchrun (resuming a "
                        "single-process checkpoint on several ranks is not supported)")
    plain = load_plain(path / "trainer.pt", map_location="cpu")
    model_state, optim_state = get_state_dict(trainer.model, trainer.optimizer)
    with warnings.catch_warnings():  # one process reads every shard itself, as intended: no warning
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": model_state, "optim": optim_state["state"]}, storage_reader=SafeReader(path / SHARDS),
                 no_dist=not world.distributed)
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=model_state,
                   optim_state_dict={"state": optim_state["state"],
                                     "param_groups": plain["optimizer"]["param_groups"]})
    trainer.load_counters(plain)
    engine.version = state.step
    rng = path / rng_file(world.rank)
    if state.world_size == world.size and rng.is_file():
        checkpoint.restore_rng(load_plain(rng), engine.generator)
    return rank_state(state, world, local_batch)


def rank_state(state: RunState, world: World, local_batch: int) -> RunState:
    """This rank's counters. On as many ranks as wrote the checkpoint, exactly its own. On another
    number, DCP has resharded the weights and optimizer exactly, but the prompt order cannot be:
    rank r draws prompts r, r+N, r+2N, ... of the shuffled stream, so every rank restarts after the
    slowest rank's position (prompts some ranks had drawn beyond it are drawn again), the ledger
    restarts at `step` batches trained and rank 0 keeps the totals of rejected and dropped groups."""
    saved = state.ranks or [{"cursor": state.cursor, "ledger": state.ledger,
                             "reward_failures": state.reward_failures}]
    if len(saved) == world.size:
        mine = saved[world.rank]
    else:
        position = min(r["cursor"] for r in saved) * len(saved)
        totals = {key: sum(r["ledger"].get(key, 0) for r in saved) for key in ("dropped_stale", "rejected")}
        ledger = {"trained": state.step * local_batch, **(totals if world.is_main else {})}
        failures = sum(r["reward_failures"] for r in saved) if world.is_main else 0
        mine = {"cursor": position // world.size, "ledger": ledger, "reward_failures": failures}
    return dataclasses.replace(state, cursor=mine["cursor"], ledger=dict(mine["ledger"]),
                               reward_failures=mine["reward_failures"], ranks=[])
