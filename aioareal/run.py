"""One training run, start to finish. Reads as a table of contents: `setup` builds the parts from
the config, `train` runs the orchestrator on an event loop, `cleanup` releases threads and files."""
from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import signal
import sys
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from . import checkpoint
from .config import Config, dump_yaml, save_config
from .errors import RunStopped, UserError
from .evaluation import EvalSet, evaluate
from .generation import Engine, SamplingParams
from .dashboard import Dashboard, plain_line, wants_dashboard
from .hooks import RunHooks
from .io import atomic_write_text
from .live import LiveState
from .metrics import RunLog
from .models import eos_token_ids, load_model, load_tokenizer, resolve_dtype
from .orchestrator import EngineWorker, Orchestrator, Schedule, TrainerWorker
from .orchestrator.loop import Resume
from .prompts import PromptSource
from .rewards import RewardService
from .samples import Group
from .tasks import PromptRenderer, build_scorer, build_task
from .tasks.base import Example
from .trainer import Trainer
from .weightsync import WeightSync

DONE_FILE = "DONE"


def resolve_device(name: str, role: str) -> torch.device:
    """'auto': the generator on cuda:0, the trainer on cuda:1 when there are two GPUs, else both on
    cuda:0; the CPU when there is no GPU."""
    if name != "auto":
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"rollout.{role}_device is '{name}' but no CUDA device is available")
        return device
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", 1 if role == "train" and torch.cuda.device_count() > 1 else 0)


def default_run_dir(config: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.rollout.mode}-{config.algo.objective}-{stamp}"


@dataclass
class Parts:
    config: Config
    run_dir: Path
    engine: Engine
    generator: EngineWorker
    trainer: TrainerWorker
    rewards: RewardService
    prompts: PromptSource
    log: RunLog
    decode: Callable[[list[int]], str]
    tokenizer: Any
    live: LiveState | None
    start_step: int = 0
    resume: Resume | None = None


def model_path(config: Config, log: Callable[[str], None]) -> str:
    if config.model.name == "tiny":
        from .warmup import ensure_tiny

        return str(ensure_tiny(config, log))
    return config.model.name


def encode_prompts(examples: list[Example], renderer: PromptRenderer, limit: int, skip_bad: bool,
                   split: str, log: Callable[[str], None]) -> tuple[list[Example], dict[str, list[int]]]:
    """Tokenise every prompt once, up front, so a prompt longer than the context is reported (or,
    with data.skip_bad_rows, skipped and counted) before training starts, not hours into it."""
    kept, ids, too_long = [], {}, []
    for example in examples:
        tokens = renderer.ids(example)
        if len(tokens) > limit:
            too_long.append((example.uid, len(tokens)))
            continue
        kept.append(example)
        ids[example.uid] = tokens
    if too_long and not skip_bad:
        uid, n = too_long[0]
        raise UserError(f"{split} prompt '{uid}' has {n} tokens, more than data.max_prompt_tokens={limit} "
                        f"({len(too_long)} such prompts); raise the limit or set data.skip_bad_rows=true")
    if too_long:
        log(f"skipped {len(too_long)} {split} prompts longer than data.max_prompt_tokens={limit}")
    if not kept:
        raise UserError(f"no {split} prompts left (all {len(examples)} are longer than data.max_prompt_tokens)")
    return kept, ids


def setup(config: Config, run_dir: Path, log: Callable[[str], None] = print,
          resume_from: Path | None = None) -> Parts:
    """Build every part of a run from its config; `resume_from` is a checkpoint to continue."""
    torch.manual_seed(config.run.seed)
    random.seed(config.run.seed)
    gen_device = resolve_device(config.rollout.gen_device, "gen")
    train_device = resolve_device(config.rollout.train_device, "train")
    task = build_task(config)
    train_examples, eval_examples = task.splits()  # data errors surface before any model loads
    if getattr(task, "skipped", 0):
        log(f"skipped {task.skipped} malformed rows (data.skip_bad_rows)")
    path = model_path(config, log)
    tokenizer = load_tokenizer(path, config.model.trust_remote_code)
    chat = task.chat if config.data.chat_template is None else config.data.chat_template
    renderer = PromptRenderer(tokenizer, chat, config.data.system_prompt, config.data.prompt_template)
    limit, skip = config.data.max_prompt_tokens, config.data.skip_bad_rows
    train_examples, train_ids = encode_prompts(train_examples, renderer, limit, skip, "training", log)
    if eval_examples:
        eval_examples, eval_ids = encode_prompts(eval_examples, renderer, limit, skip, "held-out", log)
        eval_set = EvalSet(eval_examples, [eval_ids[e.uid] for e in eval_examples])
    else:
        eval_set = EvalSet([], [])

    policy = str(resume_from / "policy") if resume_from else path
    gen_model = load_model(policy, resolve_dtype(config.model.dtype, gen_device), gen_device,
                           config.model.trust_remote_code, allow_pickle=config.model.allow_pickle)
    train_model = load_model(policy, torch.float32, train_device, config.model.trust_remote_code,
                             allow_pickle=config.model.allow_pickle)
    compute_dtype = resolve_dtype(config.model.train_dtype, train_device)
    ref_model = None
    if config.algo.kl_coef > 0:  # coefficient 0 keeps no reference model at all
        # The reference is the policy the run started from, also when resuming.
        source = load_model(path, compute_dtype, train_device, config.model.trust_remote_code,
                            allow_pickle=config.model.allow_pickle) if resume_from else copy.deepcopy(train_model)
        ref_model = source.to(compute_dtype).eval().requires_grad_(False)
    eos = eos_token_ids(gen_model, tokenizer)
    g, a = config.generation, config.algo
    # The KV cache is sized by the longest prompt actually present, not by the configured limit.
    longest = max(len(ids) for ids in [*train_ids.values(), *eval_set.prompt_ids])
    max_len = longest + max(g.max_new_tokens, config.eval.max_new_tokens or 0)
    limit = getattr(gen_model.config, "max_position_embeddings", max_len)
    if max_len > limit:
        raise UserError(f"the longest prompt + generation.max_new_tokens = {max_len} exceeds the model's "
                        f"context of {limit} tokens")
    engine = Engine(gen_model, eos, num_slots=g.num_slots or a.batch_groups * a.group_size, max_len=max_len,
                    params=SamplingParams(g.temperature, g.top_p, g.max_new_tokens), seed=config.run.seed,
                    cuda_graphs=g.cuda_graphs, recompute_kv=g.recompute_kv, compile=g.compile)
    sync = WeightSync(train_model, gen_model)
    trainer = Trainer(train_model, config, tokenizer.pad_token_id, ref_model, compute_dtype)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    eval_tokens = config.eval.max_new_tokens or g.max_new_tokens

    def run_eval() -> dict[str, float]:
        result = evaluate(train_model, eval_set, task.score, decode, eos, eval_tokens)
        return {"eval_pass_rate": result.pass_rate, "eval_len_mean": result.mean_length}

    rewards = RewardService(build_scorer(config, task), decode, config.reward.workers, config.reward.timeout_s)
    state = checkpoint.load_state(resume_from) if resume_from else None
    prompts = PromptSource(train_examples, lambda e: train_ids[e.uid], seed=config.run.seed * 7919 + config.data.shuffle_seed,
                           cursor=state.cursor if state else 0)
    resume = None
    if state is not None:
        trainer.load_state_dict(checkpoint.load_trainer_state(resume_from, train_device))
        sync.set_version(state.step)
        engine.version = state.step
        checkpoint.restore_rng(checkpoint.load_rng(resume_from), engine.generator)
        resume = Resume(state.step, state.elapsed, state.ledger, state.reward_failures)
    start = state.step if state else 0
    live = LiveState(run_dir.name, config.rollout.mode, config.rollout.max_staleness, config.algo.objective,
                     [gen_device, train_device], config.train.steps)
    return Parts(config, run_dir, engine, EngineWorker(engine, sync), TrainerWorker(trainer, sync, run_eval),
                 rewards, prompts, RunLog(run_dir, resume_step=start if state else None), decode, tokenizer, live,
                 start, resume)


async def orchestrate(parts: Parts, printer: Callable[[dict[str, Any]], None]) -> Orchestrator:
    c = parts.config

    async def score(group: Group, completions: list[list[int]]) -> tuple[list[float], int]:
        return await parts.rewards.score(completions, [group.example] * len(completions))

    schedule = Schedule(c.rollout.mode, c.rollout.max_staleness, c.algo.batch_groups, c.algo.group_size,
                        c.train.steps, c.eval.every, c.algo.drop_constant_groups)
    orchestrator = Orchestrator(schedule, parts.generator, parts.trainer, parts.prompts, score, hooks=None,
                                resume=parts.resume)
    orchestrator.hooks = RunHooks(parts, orchestrator, printer)
    if parts.live is not None:
        parts.live.orchestrator = orchestrator
    install_stop_signals(orchestrator)
    await orchestrator.run()
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
    parts.log.close()


def step_printer(log: Callable[[str], None], steps: int, evals_only: bool) -> Callable[[dict[str, Any]], None]:
    """One plain line per step; above a dashboard (which shows the rest) only evaluation steps."""
    def print_row(row: dict[str, Any]) -> None:
        if not evals_only or row.get("eval_pass_rate") is not None:
            log(plain_line(row, steps))
    return print_row


def check_fresh_run_dir(run_dir: Path) -> None:
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
        with Dashboard(parts.live.snapshot, header_fn=header_fn) if dashboard else contextlib.nullcontext():
            orchestrator = run_event_loop(orchestrate(parts, printer))
    finally:
        cleanup(parts)
    if orchestrator.train.version >= config.train.steps:
        atomic_write_text(run_dir / DONE_FILE, f"{orchestrator.train.version}\n")
        log(f"run written to {run_dir}")
    elif orchestrator.stop_signal is not None:
        raise RunStopped(f"stopped at step {orchestrator.train.version}; continue with: "
                         f"python -m aioareal --resume {run_dir}", orchestrator.stop_signal)
    return run_dir
