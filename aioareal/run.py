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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from . import checkpoint, lora
from .build import (Prompts, build_data, build_engine, build_evaluator, build_models, build_prompts, build_rewards,
                    build_trainer, build_workers, context_length, model_path, resolve_device)
from .checkpoint import RunState
from .config import Config, dump_yaml, save_config
from .dashboard import Dashboard, plain_line, wants_dashboard
from .errors import RunStopped, UserError
from .generation import Engine
from .hooks import RunHooks, checkpoint_saver
from .live import LiveState
from .metrics import RunLog
from .models import eos_token_ids, load_tokenizer
from .orchestrator import EngineWorker, Orchestrator, Schedule, StepReport, TrainerWorker
from .prompts import PromptSource
from .rewards import RewardService
from .samples import Group
from .trackers import TrackerFeed, check_installed, start_trackers


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
    trackers: TrackerFeed = field(default_factory=lambda: TrackerFeed({}))  # run.trackers (none: a no-op)

    @property
    def start_step(self) -> int:
        return self.resume.step if self.resume else 0


def setup(config: Config, run_dir: Path, log: Callable[[str], None] = print,
          resume_from: Path | None = None) -> Parts:
    """Build every part of a run from its config; `resume_from` is a checkpoint to continue."""
    torch.manual_seed(config.run.seed)
    random.seed(config.run.seed)
    check_installed(config.run.trackers)  # a missing package is an error before anything loads
    gen_device = resolve_device(config.rollout.gen_device, "gen")
    train_device = resolve_device(config.rollout.train_device, "train")
    data = build_data(config, log)  # data errors surface before any model loads
    start = model_path(config, log)
    tokenizer = load_tokenizer(start, config.model.trust_remote_code)
    prompts = build_prompts(config, data, tokenizer, log)
    models = build_models(config, start, resume_from, gen_device, train_device)
    if config.model.lora_rank:
        log(lora.describe(models.train))
    eos = eos_token_ids(models.gen, tokenizer)
    engine = build_engine(config, models.gen, eos, _engine_context(config, models, prompts))
    trainer = build_trainer(config, models, tokenizer.pad_token_id)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    evaluator = build_evaluator(config, models.train, prompts.eval_set, data.task, decode, eos)
    state = checkpoint.restore(resume_from, trainer, engine) if resume_from else None
    generator, trainer_worker = build_workers(engine, trainer, models.gen, evaluator)
    source = PromptSource(prompts.train, lambda e: prompts.train_ids[e.uid],
                          seed=config.run.seed * 7919 + config.data.shuffle_seed, cursor=state.cursor if state else 0)
    live = LiveState(run_dir.name, config.rollout.mode, config.rollout.max_staleness, config.algo.objective,
                     [gen_device, train_device], config.train.steps)
    return Parts(config, run_dir, engine, generator, trainer_worker, build_rewards(config, data.task, decode),
                 source, RunLog(run_dir, resume_step=state.step if state else None), tokenizer, live, state,
                 start_trackers(config, run_dir))


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

    save = checkpoint_saver(parts.run_dir, parts.trainer, parts.engine.generator, parts.tokenizer,
                            c.run.keep_checkpoints)
    return RunHooks(write_row, parts.log.samples, show, save, c.run.checkpoint_every, c.train.steps,
                    parts.start_step)


async def orchestrate(parts: Parts, printer: Callable[[dict[str, Any]], None]) -> Orchestrator:
    c = parts.config

    async def score(group: Group, completions: list[list[int]]) -> tuple[list[float], int]:
        return await parts.rewards.score(completions, [group.example] * len(completions))

    schedule = Schedule(c.rollout.mode, c.rollout.max_staleness, c.algo.batch_groups, c.algo.group_size,
                        c.train.steps, c.eval.every, c.algo.drop_constant_groups)
    orchestrator = Orchestrator(schedule, parts.generator, parts.trainer, parts.prompts, score,
                                build_hooks(parts, printer), resume=parts.resume)
    install_stop_signals(orchestrator)
    refresher = asyncio.create_task(parts.live.keep_fresh(orchestrator.live_counters))
    try:
        await orchestrator.run()
    finally:
        refresher.cancel()
    return orchestrator


def install_stop_signals(orchestrator: Orchestrator) -> None:
    """First Ctrl-C / SIGTERM: finish the current step, checkpoint, exit cleanly. Second: exit now."""
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


def train(config: Config, log: Callable[[str], None] = print,
          printer: Callable[[dict[str, Any]], None] | None = None, resume_from: Path | None = None,
          header_fn: Callable[[], str] | None = None) -> Path:
    """Run a training job to completion (or continue one from a checkpoint); returns the run dir.
    Progress goes to the live dashboard on a terminal, else one plain line per step (`printer`
    replaces both); `header_fn` adds a line above the dashboard (the sweep's progress)."""
    run_dir = Path(config.run.run_dir) if config.run.run_dir else default_run_dir(config)
    if resume_from is None:
        check_fresh_run_dir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log(dump_yaml(config))
    save_config(config, run_dir / "config.yaml")
    parts = setup(config, run_dir, log, resume_from)
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
        checkpoint.mark_done(run_dir, orchestrator.train.version)
        log(f"run written to {run_dir}")
    elif orchestrator.stop_signal is not None:
        raise RunStopped(f"stopped at step {orchestrator.train.version}; continue with: "
                         f"python -m aioareal --resume {run_dir}", orchestrator.stop_signal)
    return run_dir
