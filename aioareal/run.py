"""One training run, start to finish. Reads as a table of contents: `setup` builds the parts from
the config, `train` runs the orchestrator on an event loop, `cleanup` releases threads and files."""
from __future__ import annotations

import asyncio
import copy
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .config import Config, dump_yaml, save_config
from .errors import UserError
from .evaluation import EvalSet, evaluate
from .generation import Engine, SamplingParams
from .metrics import RunLog
from .models import eos_token_ids, load_model, load_tokenizer, resolve_dtype
from .orchestrator import EngineWorker, Orchestrator, Schedule, TrainerWorker
from .prompts import PromptSource
from .rewards import RewardService, per_item
from .samples import Group
from .tasks import PromptRenderer, build_task
from .tasks.base import Example
from .trainer import Trainer
from .weightsync import WeightSync


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


def model_path(config: Config, log: Callable[[str], None]) -> str:
    if config.model.name == "tiny":
        from .warmup import ensure_tiny

        return str(ensure_tiny(config, log))
    return config.model.name


def prompt_encoder(renderer: PromptRenderer, limit: int, skip_bad: bool) -> Callable[[Example], list[int]]:
    def encode(example: Example) -> list[int]:
        ids = renderer.ids(example)
        if len(ids) > limit:
            raise UserError(f"prompt of example {example.uid} has {len(ids)} tokens, more than "
                            f"data.max_prompt_tokens={limit}; raise it or shorten the prompt")
        return ids
    return encode


def setup(config: Config, run_dir: Path, log: Callable[[str], None] = print) -> Parts:
    torch.manual_seed(config.run.seed)
    random.seed(config.run.seed)
    gen_device = resolve_device(config.rollout.gen_device, "gen")
    train_device = resolve_device(config.rollout.train_device, "train")
    task = build_task(config)
    train_examples, eval_examples = task.splits()  # data errors surface before any model loads
    path = model_path(config, log)
    tokenizer = load_tokenizer(path, config.model.trust_remote_code)
    chat = task.chat if config.data.chat_template is None else config.data.chat_template
    renderer = PromptRenderer(tokenizer, chat, config.data.system_prompt, config.data.prompt_template)
    encode = prompt_encoder(renderer, config.data.max_prompt_tokens, config.data.skip_bad_rows)
    eval_set = EvalSet(eval_examples, [encode(e) for e in eval_examples])

    gen_model = load_model(path, resolve_dtype(config.model.dtype, gen_device), gen_device,
                           config.model.trust_remote_code)
    train_model = load_model(path, torch.float32, train_device, config.model.trust_remote_code)
    compute_dtype = resolve_dtype(config.model.train_dtype, train_device)
    ref_model = None
    if config.algo.kl_coef > 0:  # coefficient 0 keeps no reference model at all
        ref_model = copy.deepcopy(train_model).to(compute_dtype).eval().requires_grad_(False)
    eos = eos_token_ids(gen_model, tokenizer)
    g, a = config.generation, config.algo
    max_len = config.data.max_prompt_tokens + g.max_new_tokens
    limit = getattr(gen_model.config, "max_position_embeddings", max_len)
    if max_len > limit:
        raise UserError(f"data.max_prompt_tokens + generation.max_new_tokens = {max_len} exceeds the model's "
                        f"context of {limit} tokens")
    engine = Engine(gen_model, eos, num_slots=g.num_slots or a.batch_groups * a.group_size, max_len=max_len,
                    params=SamplingParams(g.temperature, g.top_p, g.max_new_tokens), seed=config.run.seed,
                    cuda_graphs=g.cuda_graphs, recompute_kv=g.recompute_kv)
    sync = WeightSync(train_model, gen_model)
    trainer = Trainer(train_model, config, tokenizer.pad_token_id, ref_model, compute_dtype)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    eval_tokens = config.eval.max_new_tokens or g.max_new_tokens

    def run_eval() -> dict[str, float]:
        result = evaluate(train_model, eval_set, task.score, decode, eos, eval_tokens)
        return {"eval_pass_rate": result.pass_rate, "eval_len_mean": result.mean_length}

    rewards = RewardService(per_item(task.score), decode, config.reward.workers, config.reward.timeout_s)
    prompts = PromptSource(train_examples, encode, seed=config.run.seed * 7919 + config.data.shuffle_seed)
    return Parts(config, run_dir, engine, EngineWorker(engine, sync), TrainerWorker(trainer, sync, run_eval),
                 rewards, prompts, RunLog(run_dir), decode)


class RunHooks:
    """Writes each step's rows and prints a one-line summary."""

    def __init__(self, parts: Parts, orchestrator: Orchestrator, printer: Callable[[dict[str, Any]], None]) -> None:
        self.parts, self.o, self.printer = parts, orchestrator, printer

    async def on_eval(self, step: int, row: dict[str, Any]) -> None:
        self.parts.log.step(row)
        self.printer(row)

    async def on_step(self, step: int, row: dict[str, Any], groups: list[Group]) -> None:
        self.parts.log.step(row)
        self.parts.log.samples(self.o.sample_rows(step, groups))
        self.printer(row)


def format_row(row: dict[str, Any]) -> str:
    parts = [f"step {row['step']:>4}", f"t {row['time']:7.1f}s"]
    for key, label, fmt in (("reward_mean", "reward", ".3f"), ("loss", "loss", "+.4f"), ("kl", "kl", ".4f"),
                            ("staleness_mean", "stale", ".2f"), ("gen_tokens_per_s", "gen tok/s", ".0f"),
                            ("eval_pass_rate", "eval", ".3f")):
        if row.get(key) is not None:
            parts.append(f"{label} {row[key]:{fmt}}")
    return " | ".join(parts)


async def orchestrate(parts: Parts, printer: Callable[[dict[str, Any]], None]) -> Orchestrator:
    c = parts.config

    async def score(group: Group, completions: list[list[int]]) -> tuple[list[float], int]:
        return await parts.rewards.score(completions, [group.example] * len(completions))

    schedule = Schedule(c.rollout.mode, c.rollout.max_staleness, c.algo.batch_groups, c.algo.group_size,
                        c.train.steps, c.eval.every)
    orchestrator = Orchestrator(schedule, parts.generator, parts.trainer, parts.prompts, score, hooks=None)
    orchestrator.hooks = RunHooks(parts, orchestrator, printer)
    await orchestrator.run()
    return orchestrator


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


def train(config: Config, log: Callable[[str], None] = print,
          printer: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """Run a training job to completion; returns the run directory."""
    run_dir = Path(config.run.run_dir) if config.run.run_dir else default_run_dir(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    log(dump_yaml(config))
    save_config(config, run_dir / "config.yaml")
    parts = setup(config, run_dir, log)
    try:
        run_event_loop(orchestrate(parts, printer or (lambda row: log(format_row(row)))))
    finally:
        cleanup(parts)
    log(f"run written to {run_dir}")
    return run_dir
