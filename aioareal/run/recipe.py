"""One training run, start to finish. Reads as a table of contents: `setup` builds the parts from
the config, `train` runs the orchestrator on an event loop, `cleanup` releases threads and files."""
from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import checkpoint
from ..checkpoint import RunState
from ..checkpoint import sharded as dcp
from ..config import Config, dump_yaml, save_config
from ..devices import cpu_threads, threads_restored
from ..distributed.sharding import Mirror
from ..distributed.world import World, current
from ..errors import RunStopped, UserError
from ..generation import Engine
from ..models import eos_token_ids, load_tokenizer, lora
from ..monitor.dashboard import Dashboard, plain_line, wants_dashboard
from ..monitor.live import LiveState
from ..monitor.metrics import RunLog
from ..monitor.trackers import TrackerFeed, check_installed, start_trackers
from ..orchestrator import EngineWorker, Orchestrator, Schedule, StepReport, TrainerWorker
from ..prompts import PromptSource
from ..rewards.service import RewardService
from .build import (
    Prompts,
    build_data,
    build_engine,
    build_evaluator,
    build_models,
    build_prompts,
    build_rewards,
    build_trainer,
    build_workers,
    context_length,
    model_path,
    resolve_device,
)
from .cell import QuietLog, build_sharded_evaluator, cell_config, engine_seed, recorded
from .hooks import RunHooks, checkpoint_saver
from .rank_hooks import RankHooks, sharded_saver


def default_run_dir(config: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.rollout.mode}-{config.algo.objective}-{stamp}"


@dataclass
class Parts:
    """Everything one run is made of, built by `setup` and released by `cleanup`."""

    config: Config
    run_dir: Path
    engine: Engine
    generator: EngineWorker
    trainer: TrainerWorker
    rewards: RewardService
    prompts: PromptSource
    log: RunLog
    tokenizer: Any
    live: LiveState
    resume: RunState | None = None  # the checkpoint's counters when continuing a run
    world: World = World()  # this rank's place in a torchrun job (rank 0 of 1 for one process)
    mirror: Mirror | None = None  # under torchrun: the full weights, gathered for evaluation and export
    trackers: TrackerFeed = field(default_factory=lambda: TrackerFeed({}))  # run.trackers (none: a no-op)

    @property
    def start_step(self) -> int:
        return self.resume.step if self.resume else 0


def setup(config: Config, run_dir: Path, log: Callable[[str], None] = print,
          resume_from: Path | None = None, world: World = World()) -> Parts:
    """Build every part of a run from its config; `resume_from` is a checkpoint to continue. Under
    torchrun `config` is this rank's cell's (`cell_config`) and the trainer is sharded."""
    torch.manual_seed(config.run.seed)  # the same on every rank: random weights start equal
    random.seed(config.run.seed)
    check_installed(config.run.trackers)  # a missing package is an error before anything loads
    slot = (world.local_rank, config.rollout.devices_per_rank) if world.distributed else None
    gen_device = resolve_device(config.rollout.gen_device, "gen", slot)
    train_device = resolve_device(config.rollout.train_device, "train", slot)
    data = build_data(config, log)  # data errors surface before any model loads
    # Every rank asks: a file lock lets one warm-start the tiny model while the others wait for it
    # (a collective would time out on a slow machine), then all load the cached copy.
    start = model_path(config, log)
    threads = cpu_threads([gen_device, train_device], config.run.cpu_threads, config.rollout.mode != "sync")
    if threads:
        torch.set_num_threads(threads)  # process-wide: every torch thread's team takes this width
    tokenizer = load_tokenizer(start, config.model.trust_remote_code)
    prompts = build_prompts(config, data, tokenizer, log)
    models = build_models(config, start, resume_from, gen_device, train_device)
    if config.model.lora_rank:
        log(lora.describe(models.train))
    mirror = Mirror(models.train) if world.distributed else None  # copied before sharding
    eos = eos_token_ids(models.gen, tokenizer)
    engine = build_engine(config, models.gen, eos, _engine_context(config, models, prompts),
                          seed=engine_seed(config, world))
    trainer = build_trainer(config, models, tokenizer.pad_token_id, world)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    evaluator = (build_sharded_evaluator(config, mirror, trainer, prompts.eval_set, data.task, decode, eos, world)
                 if mirror else build_evaluator(config, models.train, prompts.eval_set, data.task, decode, eos))
    state = _restore(resume_from, trainer, engine, world, config) if resume_from else None
    generator, trainer_worker = build_workers(engine, trainer, models.gen, evaluator)
    source = PromptSource(prompts.train, lambda e: prompts.train_ids[e.uid],
                          seed=config.run.seed * 7919 + config.data.shuffle_seed, cursor=state.cursor if state else 0,
                          stride=world.size, offset=world.rank)
    live = LiveState(run_dir.name, config.rollout.mode, config.rollout.max_staleness, config.algo.objective,
                     [gen_device, train_device], config.train.steps, world.size)
    run_log = RunLog(run_dir, resume_step=state.step if state else None) if world.is_main else QuietLog()
    return Parts(config, run_dir, engine, generator, trainer_worker, build_rewards(config, data.task, decode),
                 source, run_log, tokenizer, live, state, world, mirror,
                 start_trackers(config, run_dir) if world.is_main else TrackerFeed({}))


def _restore(path: Path, trainer: Any, engine: Engine, world: World, config: Config) -> RunState:
    """A checkpoint written by several ranks restores through DCP (also on another number of ranks)."""
    if world.distributed or (path / checkpoint.SHARDS).is_dir():
        return dcp.restore(path, trainer, engine, world, config.algo.batch_groups)
    return checkpoint.restore(path, trainer, engine)


def _engine_context(config: Config, models: Any, prompts: Prompts) -> int:
    # The KV cache is sized by the longest prompt actually present, not by the configured limit.
    longest = max(len(ids) for ids in [*prompts.train_ids.values(), *prompts.eval_set.prompt_ids])
    new_tokens = max(config.generation.max_new_tokens, config.eval.max_new_tokens or 0)
    return context_length(models.gen, longest, new_tokens, "the longest prompt + generation.max_new_tokens")


def build_hooks(parts: Parts, printer: Callable[[dict[str, Any]], None]) -> RunHooks:
    c = parts.config

    def show(report: StepReport) -> None:
        parts.live.record(report.row, report.staleness or None)
        parts.live.refresh()
        printer(report.row)

    def write_row(row: dict[str, Any]) -> None:
        parts.log.step(row)  # metrics.jsonl, the source of truth
        parts.trackers.log(row)  # the same row to the trackers' thread (never waits)

    if parts.mirror is not None:
        save = sharded_saver(parts.run_dir, parts.trainer, parts.engine.generator, parts.mirror, parts.tokenizer,
                             c.run.keep_checkpoints, parts.world)
    else:
        save = checkpoint_saver(parts.run_dir, parts.trainer, parts.engine.generator, parts.tokenizer,
                                c.run.keep_checkpoints)
    return RunHooks(write_row, parts.log.samples, show, save, c.run.checkpoint_every, c.train.steps,
                    parts.start_step)


async def orchestrate(parts: Parts, printer: Callable[[dict[str, Any]], None]) -> Orchestrator:
    c = parts.config

    schedule = Schedule(c.rollout.mode, c.rollout.max_staleness, c.algo.batch_groups, c.algo.group_size,
                        c.train.steps, c.eval.every, c.algo.drop_constant_groups)
    hooks = build_hooks(parts, printer)
    # Under torchrun steps are reported to all ranks and a stop is settled between them (DESIGN rule 7).
    rank_hooks = RankHooks(hooks, parts.world) if parts.world.distributed else None
    orchestrator = Orchestrator(schedule, parts.generator, parts.trainer, parts.prompts, parts.rewards.score_group,
                                rank_hooks or hooks, resume=parts.resume,
                                score_counters=parts.rewards.stats.metrics)
    install_stop_signals(rank_hooks or orchestrator)
    refresher = asyncio.create_task(parts.live.keep_fresh(orchestrator.live_counters))
    try:
        await orchestrator.run()
    finally:
        refresher.cancel()
        if rank_hooks is not None:
            rank_hooks.close()
    return orchestrator


def install_stop_signals(orchestrator: Orchestrator | RankHooks) -> None:
    """First Ctrl-C / SIGTERM: finish the current step, checkpoint, exit cleanly. Second: exit now.
    Under torchrun `orchestrator` is the rank's `RankHooks`, which stops every rank after one step."""
    loop = asyncio.get_running_loop()

    def stop(signum: int) -> None:
        if orchestrator.stop_requested:
            # Immediate exit is safe: checkpoints are renamed into place and metrics lines are
            # single appends that a resume repairs.
            print("exiting now", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        print(f"\n{signal.Signals(signum).name}: finishing the current step and checkpointing "
              "(press Ctrl-C again to exit at once)", file=sys.stderr, flush=True)
        orchestrator.request_stop(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop, signum)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
            return


def run_event_loop(coro: Any) -> Any:
    """asyncio.run on uvloop when it is installed (faster loop internals), plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def cleanup(parts: Parts) -> None:
    parts.generator.close()
    parts.trainer.close()
    parts.rewards.close()
    parts.trackers.close()
    parts.log.close()


def _quiet(*_: Any) -> None:
    pass


def step_printer(log: Callable[[str], None], steps: int, evals_only: bool) -> Callable[[dict[str, Any]], None]:
    """One plain line per step; above a dashboard (which shows the rest) only evaluation steps."""
    def print_row(row: dict[str, Any]) -> None:
        if not evals_only or row.get("eval_pass_rate") is not None:
            log(plain_line(row, steps))
    return print_row


def check_fresh_run_dir(run_dir: Path) -> None:
    """A new run never writes over another's outputs."""
    if (run_dir / "metrics.jsonl").exists() or checkpoint.list_checkpoints(run_dir):
        raise UserError(f"{run_dir} already holds a run; continue it with --resume {run_dir}, "
                        "or choose another --run-dir")


def _run_dir(config: Config, resume_from: Path | None) -> Path:
    run_dir = Path(config.run.run_dir) if config.run.run_dir else default_run_dir(config)
    if resume_from is None:
        check_fresh_run_dir(run_dir)
    return run_dir


def train(config: Config, log: Callable[[str], None] = print,
          printer: Callable[[dict[str, Any]], None] | None = None, resume_from: Path | None = None,
          header_fn: Callable[[], str] | None = None) -> Path:
    """Run a training job to completion (or continue one from a checkpoint); returns the run dir.
    Progress goes to the live dashboard on a terminal, else one plain line per step (`printer`
    replaces both); `header_fn` adds a line above the dashboard (the sweep's progress)."""
    world = current()
    if not world.is_main:  # under torchrun rank 0 speaks for all; the others print only errors
        log, printer = _quiet, _quiet
    run_dir = world.main_decides(lambda: _run_dir(config, resume_from))  # one directory, one check, for all ranks
    run_dir.mkdir(parents=True, exist_ok=True)
    log(dump_yaml(recorded(config, world)))
    if world.is_main:
        save_config(recorded(config, world), run_dir / "config.yaml")
    with threads_restored():  # setup may narrow torch's threads (run.cpu_threads): the caller gets them back
        parts = setup(cell_config(config, world), run_dir, log, resume_from, world)
        if resume_from is not None:
            log(f"resuming {run_dir} from step {parts.start_step}")
        dashboard = printer is None and wants_dashboard(config.run.dashboard)
        if printer is None:
            printer = step_printer(log, config.train.steps, evals_only=dashboard)
        try:
            with Dashboard(lambda: parts.live.latest, header_fn=header_fn) if dashboard else contextlib.nullcontext():
                orchestrator = run_event_loop(orchestrate(parts, printer))
        finally:
            cleanup(parts)
    if orchestrator.train.version >= config.train.steps:
        if world.is_main:
            checkpoint.mark_done(run_dir, orchestrator.train.version)
        log(f"run written to {run_dir}")
    elif orchestrator.stop_signal is not None:
        raise RunStopped(f"stopped at step {orchestrator.train.version}; continue with: "
                         f"python -m aioareal --resume {run_dir}", orchestrator.stop_signal)
    return run_dir
