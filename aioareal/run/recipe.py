"""One training run, start to finish, read as a table of contents: `setup` builds the parts from the
config, `train` runs the orchestrator on an event loop, `cleanup` releases threads and files;
`resume` continues one from its latest checkpoint. The
process shape (one process, or one torchrun rank) is the `Cell` it is given (cell.py): setup asks it,
never torch.distributed."""
from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import checkpoint
from ..checkpoint import RunState
from ..checkpoint.atomic import own_run_dir, release_run_dir, remove_husk
from ..checkpoint.resume_plan import decide, resume_config
from ..config import Config, dump_yaml, save_config
from ..devices import fix_mmap_threshold, threads_restored, with_run_threads
from ..errors import RunStopped, UserError
from ..evaluation.scored_completions import KeptCompletions
from ..generation.backends import Backend
from ..models.load_policy import eos_token_ids, load_tokenizer
from ..models.lora import describe
from ..monitor.dashboard import Dashboard, wants_dashboard
from ..monitor.metrics import LiveState
from ..monitor.trackers import TrackerFeed, check_installed
from ..orchestrator import Orchestrator, Schedule, StepReport, TrainerWorker
from ..orchestrator.loop import PromptSource
from ..rewards.service import RewardService
from ..trainer.optim import relative_step_warning
from .build import (
    build_data,
    build_engine,
    build_models,
    build_prompts,
    build_rewards,
    build_trainer,
    build_workers,
    check_engine,
    engine_context,
    model_path,
)
from .cell import Cell, EvalInputs, Rollout, current_cell, rollout_kind
from .events import LoopLag, RunHooks, quiet, run_event_loop, step_printer, stop_signals


@dataclass
class Parts:
    """Everything one run is made of, built by `setup` and released by `cleanup`."""

    config: Config
    run_dir: Path
    cell: Cell  # one process, or this rank's place in a torchrun job
    engine: Backend
    rollout: Rollout  # the generator, its scorer and counters, the evaluator (single completions or episodes)
    trainer: TrainerWorker
    rewards: RewardService
    prompts: PromptSource
    log: Any  # monitor.metrics.RunLog (rank 0) or a quiet one
    tokenizer: Any
    live: LiveState
    trackers: TrackerFeed  # run.trackers (none: a no-op)
    resume: RunState | None = None  # the checkpoint's counters when continuing a run
    kept: KeptCompletions | None = None  # the last evaluation's completions, for eval_samples.jsonl

    @property
    def start_step(self) -> int:
        return self.resume.step if self.resume else 0


def start_model(config: Config, devices: list[torch.device], log: Callable[[str], None]) -> tuple[Path, int | None]:
    """The model to start from (`model_path`) and the width of the run's one CPU team when it has
    one (devices.one_cpu_team, sync on the CPU). Then the heavy setup (a warm-start, a GGUF
    conversion) runs at full width on a thread that exits after it, taking its team along; the
    rest of the setup runs on this thread at width 1, and the generator and trainer share one
    worker thread (devices.with_run_threads)."""
    return with_run_threads(lambda team: (model_path(config, log), team), devices,
                            overlapping=config.rollout.mode != "sync", setting=config.run.cpu_threads)


def setup(config: Config, run_dir: Path, cell: Cell, log: Callable[[str], None] = print,
          resume_from: Path | None = None) -> Parts:
    """Build every part of a run from its config (this cell's: `cell.config`); `resume_from` is a
    checkpoint to continue."""
    torch.manual_seed(config.run.seed)  # the same on every rank: random weights start equal
    random.seed(config.run.seed)
    check_installed(config.run.trackers)  # a missing package is an error before anything loads
    gen_device = cell.device(config.rollout.gen_device, "gen", config)
    train_device = cell.device(config.rollout.train_device, "train", config)
    data = build_data(config, log)  # data errors surface before any model loads
    start, team = start_model(config, [gen_device, train_device], log)
    if config.run.mmap_threshold_mb and "cpu" in (gen_device.type, train_device.type):
        fix_mmap_threshold(config.run.mmap_threshold_mb)  # before the models: their tensors follow it
    tokenizer = load_tokenizer(start, config.model.trust_remote_code)
    prompts = build_prompts(config, data, tokenizer, log)
    kind = rollout_kind(config, tokenizer, prompts.chat, cell.world.size, log)  # single completions or episodes
    models = build_models(config, start, resume_from, gen_device, train_device)
    if config.model.lora_rank:
        log(describe(models.train))
    eos = eos_token_ids(models.gen, tokenizer)
    max_len, seed = engine_context(config, models.gen, prompts), cell.engine_seed(config)
    engine = build_engine(config, models.gen, eos, max_len, seed=seed, log=log)
    engine = check_engine(config, engine, models.gen, eos, max_len, prompts.train_ids[prompts.train[0].uid], seed, log)
    trainer = build_trainer(config, models, tokenizer.pad_token_id, cell.shard)
    pretrained = config.model.name != "tiny" and not resume_from  # its weights' scale says what lr does to it
    if pretrained and (note := relative_step_warning(models.train, config.algo.lr, bool(config.model.lora_rank))):
        log(note)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    kept = KeptCompletions()
    evaluator = kind.evaluator(EvalInputs(cell, config, trainer, prompts.eval_set, data.task, decode, eos, kept))
    state = cell.restore(resume_from, trainer, engine, config) if resume_from else None
    engine_worker, trainer_worker = build_workers(engine, trainer, models.gen, evaluator, one_thread=team,
                                                  stall_s=config.run.stall_timeout_s)
    rewards = build_rewards(config, data.task, decode)
    rollout = kind.rollout(engine_worker, rewards, evaluator)
    source = PromptSource(prompts.train, lambda e: prompts.train_ids[e.uid],
                          seed=config.run.seed * 7919 + config.data.shuffle_seed, cursor=state.cursor if state else 0,
                          stride=cell.world.size, offset=cell.world.rank, easy_first=config.data.order == "easy-first")
    live = LiveState(run_dir.name, config.rollout.mode, config.rollout.max_staleness, config.algo.objective,
                     [gen_device, train_device], config.train.steps, cell.world.size)
    return Parts(config, run_dir, cell, engine, rollout, trainer_worker, rewards, source,
                 cell.run_log(run_dir, state.step if state else None), tokenizer, live,
                 cell.trackers(config, run_dir), state, kept)


OnStep = Callable[[dict[str, Any]], Any]  # a step's metrics row -> truthy to stop the run after it


def build_hooks(parts: Parts, printer: Callable[[dict[str, Any]], None], on_step: OnStep | None = None,
                stop: Callable[[], None] = lambda: None, lag: LoopLag | None = None) -> RunHooks:
    c = parts.config

    def show(report: StepReport) -> None:
        parts.live.record(report.row, report.staleness or None, report.samples[-1] if report.samples else None)
        parts.live.refresh()
        printer(report.row)
        if on_step is not None and on_step(dict(report.row)):
            stop()

    def write_row(row: dict[str, Any]) -> None:
        if lag is not None:
            row["loop_lag_max"] = lag.take()  # seconds, the event loop's worst lateness since the last row
        parts.log.step(row)  # metrics.jsonl, the source of truth
        if "eval_pass_rate" in row and parts.kept is not None:  # an evaluation's completions, under its step
            parts.log.eval_samples(parts.kept.take(), row["step"])
        parts.trackers.log(row)  # the same row to the trackers' thread (never waits)

    save = parts.cell.saver(parts.run_dir, parts.trainer, parts.engine.generator, parts.tokenizer,
                            c.run.keep_checkpoints)
    return RunHooks(write_row, parts.log.samples, show, save, c.run.checkpoint_every, c.train.steps,
                    parts.start_step, warn=lambda line: print(line, flush=True))


async def orchestrate(parts: Parts, printer: Callable[[dict[str, Any]], None],
                      on_step: OnStep | None = None) -> Orchestrator:
    c = parts.config
    schedule = Schedule(c.rollout.mode, c.rollout.max_staleness, c.algo.batch_groups, c.algo.group_size,
                        c.train.steps, c.eval.every, c.algo.drop_constant_groups, c.run.sample_text_chars)
    rollout = parts.rollout
    stoppable: list[Any] = []  # the stop target, once the orchestrator exists
    lag = LoopLag(c.run.stall_timeout_s)
    hooks = build_hooks(parts, printer, on_step, stop=lambda: stoppable[0].request_stop(), lag=lag)
    orchestrator = Orchestrator(schedule, rollout.generator, parts.trainer, parts.prompts, rollout.score,
                                parts.cell.hooks(hooks), resume=parts.resume, score_counters=rollout.counters)
    stoppable.append(parts.cell.stop_target(orchestrator))
    refresher = asyncio.create_task(parts.live.keep_fresh(orchestrator.live_counters))
    watcher = asyncio.create_task(lag.watch())
    try:
        with stop_signals(stoppable[0]), lag.watchdog():
            await orchestrator.run()
    finally:
        refresher.cancel()
        watcher.cancel()
    return orchestrator


def cleanup(parts: Parts) -> None:
    parts.rollout.close()
    parts.trainer.close()
    parts.rewards.close()
    parts.trackers.close()
    parts.log.close()
    parts.cell.close()


def default_run_dir(config: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.rollout.mode}-{config.algo.objective}-{stamp}"


def check_fresh_run_dir(run_dir: Path) -> None:
    """A new run never writes over another's outputs."""
    if (run_dir / "metrics.jsonl").exists() or checkpoint.list_checkpoints(run_dir):
        raise UserError(f"{run_dir} already holds a run; continue it with --resume {run_dir}, "
                        "or choose another --run-dir")


def _run_dir(config: Config, resume_from: Path | None) -> Path:
    """The run's directory, owned by this process from here to the end of `train` (rank 0 alone
    under torchrun): docs/reliability.md#run-directories. Owned before it is checked, so two runs
    started together cannot both find it fresh."""
    run_dir = Path(config.run.run_dir) if config.run.run_dir else default_run_dir(config)
    own_run_dir(run_dir)
    try:
        if resume_from is None:
            check_fresh_run_dir(run_dir)
    except BaseException:
        release_run_dir(run_dir)
        raise
    return run_dir


def train(config: Config, log: Callable[[str], None] = print,
          printer: Callable[[dict[str, Any]], None] | None = None, resume_from: Path | None = None,
          header_fn: Callable[[], str] | None = None, cell: Cell | None = None,
          on_step: OnStep | None = None, echo_config: bool = True) -> Path:
    """Run a training job to completion (or continue one from a checkpoint); returns the run dir.
    Progress goes to the live dashboard on a terminal, else one plain line per step (`printer`
    replaces both); `header_fn` adds a line above the dashboard (the sweep's progress); `on_step`
    sees each step's metrics row and stops the run after that step by returning something true;
    `echo_config`: log the resolved config (else only where config.yaml is)."""
    cell = cell or current_cell()
    if not cell.is_main:  # under torchrun rank 0 speaks for all; the others print only errors
        log, printer = quiet, quiet
    run_dir = cell.main_decides(lambda: _run_dir(config, resume_from))  # one directory, one check, for all ranks
    try:
        shown = dump_yaml(cell.recorded(config)) if echo_config else f"config: {run_dir / 'config.yaml'}"
        return _train_in(run_dir, config, log, printer, resume_from, header_fn, cell, on_step, shown)
    except BaseException:
        if cell.is_main and resume_from is None:
            remove_husk(run_dir)  # a fresh run that failed before its first step leaves no directory
        raise
    finally:
        if cell.is_main:
            release_run_dir(run_dir)


def _train_in(run_dir: Path, config: Config, log: Callable[[str], None],
              printer: Callable[[dict[str, Any]], None] | None, resume_from: Path | None,
              header_fn: Callable[[], str] | None, cell: Cell, on_step: OnStep | None, shown: str) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    log(shown)
    if cell.is_main:
        save_config(cell.recorded(config), run_dir / "config.yaml")
    with threads_restored():  # setup may narrow torch's threads (run.cpu_threads): the caller gets them back
        parts = setup(cell.config(config), run_dir, cell, log, resume_from)
        if resume_from is not None:
            log(f"resuming {run_dir} from step {parts.start_step}")
        else:  # step 0 is always evaluated, and a real model's takes minutes on a CPU: say so
            log(f"evaluating the held-out prompts before any update (step 0; eval.every={config.eval.every})")
        dashboard = printer is None and wants_dashboard(config.run.dashboard)
        if printer is None:
            printer = step_printer(log, config.train.steps, evals_only=dashboard)
        try:
            with Dashboard(lambda: parts.live.latest, header_fn=header_fn) if dashboard else contextlib.nullcontext():
                orchestrator = run_event_loop(orchestrate(parts, printer, on_step))
        finally:
            cleanup(parts)
    return _finished(orchestrator, run_dir, config, cell.is_main, log)


def _finished(orchestrator: Orchestrator, run_dir: Path, config: Config, is_main: bool,
              log: Callable[[str], None]) -> Path:
    if orchestrator.train.version >= config.train.steps:
        if is_main:
            checkpoint.mark_done(run_dir, orchestrator.train.version)
        log(f"run written to {run_dir}")
        log(next_steps(run_dir, config.model.name))
    elif orchestrator.stop_signal is not None:
        raise RunStopped(f"stopped at step {orchestrator.train.version}; continue with: "
                         f"python -m aioareal --resume {run_dir}", orchestrator.stop_signal)
    return run_dir


def resume(run_dir: str | Path, overrides: list[str] | None = None, flags: dict[str, Any] | None = None,
           force: bool = False, log: Callable[[str], None] = print,
           printer: Callable[[dict[str, Any]], None] | None = None,
           header_fn: Callable[[], str] | None = None, cell: Cell | None = None,
           on_step: Callable[[dict[str, Any]], Any] | None = None, echo_config: bool = True) -> Path:
    """`--resume runs/NAME`: continue an interrupted run from its latest checkpoint, as the decisions of
    checkpoint/resume_plan.py say (made once, by rank 0 under torchrun)."""
    run_dir = Path(run_dir)
    config = resume_config(run_dir, overrides or [], flags or {}, force)
    # Under torchrun rank 0 alone reads and tidies the run directory, and tells the others.
    cell = cell or current_cell()
    # Owned before the first look (decide tidies the directory), so a live run is never touched:
    # docs/reliability.md#run-directories.
    action, latest = cell.main_decides(lambda: _owned_decision(run_dir, config, log))
    try:
        if action == "done":
            return run_dir
        return train(config, log, printer, resume_from=latest, header_fn=header_fn, cell=cell, on_step=on_step,
                     echo_config=echo_config)
    finally:
        if cell.is_main:
            release_run_dir(run_dir)


def _owned_decision(run_dir: Path, config: Any, log: Callable[[str], None]) -> tuple[str, Path | None]:
    own_run_dir(run_dir)
    try:
        if (run_dir / checkpoint.SFT_MARKER).is_file():
            raise UserError(f"--resume {run_dir}: an sft run; continue it with python -m aioareal sft --resume "
                            f"{run_dir}, or start RL from it with model.name={run_dir}")
        return decide(run_dir, config.train.steps, log)
    except BaseException:
        release_run_dir(run_dir)
        raise


def next_steps(run_dir: Path, base: str) -> str:
    """Where the trained policy is, and how to evaluate it against its base and talk to it."""
    latest = checkpoint.latest_checkpoint(run_dir)
    where = f"policy (Hugging Face format): {latest / checkpoint.POLICY_DIR}\n" if latest else ""
    return (f"{where}evaluate it against {base}: python -m aioareal eval {base} {run_dir} -n 4\n"
            f"chat with it:  python -m aioareal chat {run_dir}")
