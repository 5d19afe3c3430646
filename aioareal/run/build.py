"""Builders for the parts of a run, each from the config sections it needs. `run.setup` calls them
in order; `bench` reuses them with random weights and synthetic prompts, so both build the engine,
the trainer and the workers the same way."""
from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import PreTrainedModel

from .. import checkpoint
from ..checkpoint import ADAPTER_DIR, POLICY_DIR
from ..config import Config
from ..distributed.world import LOCAL, Collective
from ..errors import UserError, one_line
from ..evaluation.scored_completions import EvalSet
from ..generation import engine_options
from ..generation.backends import Backend, checked, choose, fallback_line, make_engine
from ..group import Example
from ..models.load_policy import checkpoint_activations, load_model, resolve_dtype
from ..models.lora import AdaptersOff, is_lora, wrap
from ..models.ops import make_lean
from ..orchestrator import EngineWorker, TrainerWorker
from ..orchestrator.workers import thread_for
from ..rewards import RewardedTask, build_scorer, build_task
from ..rewards.service import RewardService
from ..tasks import PromptRenderer, Task
from ..trainer import Trainer
from ..trainer.logprobs import TokenLogprobs
from ..trainer.masters import compile_layers
from ..weightsync.full import LoraSync, WeightSync

Log = Callable[[str], None]


# -- data ----------------------------------------------------------------------------------------
@dataclass
class Data:
    task: Task
    train: list[Example]
    held_out: list[Example]


def task_from(config: Config) -> Task:
    """The task of a run's config: the sections tasks/ reads, handed down."""
    return build_task(config.data, config.arithmetic, config.reward, config.algo.group_size)


def build_data(config: Config, log: Log) -> Data:
    """The task and its splits: data errors surface here, before any model loads."""
    task = task_from(config)
    train, held_out = task.splits()
    if getattr(task, "skipped", 0):
        log(f"skipped {task.skipped} malformed rows (data.skip_bad_rows)")
    return Data(task, train, held_out)


def model_path(config: Config, log: Log) -> str:
    """The warm-started tiny model (cached), a run directory's latest policy (an `sft` run), or model.name."""
    name = config.model.name
    if name == "tiny":
        from .warmup import ensure_tiny  # the warm-start trains a model: imported only when needed
        return str(ensure_tiny(config, log))
    run = Path(name)
    is_run = (run / "config.yaml").is_file() and checkpoint.checkpoint_dir(run).is_dir()
    return str(checkpoint.run_policy(run, log)) if is_run else name


@dataclass
class Prompts:
    train: list[Example]
    train_ids: dict[str, list[int]]  # example uid -> prompt token ids
    eval_set: EvalSet
    chat: bool = False  # rendered through the chat template (an episode's observations are too)


def build_prompts(config: Config, data: Data, tokenizer: object, log: Log) -> Prompts:
    d = config.data
    chat = data.task.chat if d.chat_template is None else d.chat_template
    renderer = PromptRenderer(tokenizer, chat, d.system_prompt, d.prompt_template)
    if isinstance(data.task, RewardedTask):  # evaluation's reward functions get completion_ids too
        data.task.encode = renderer.encoder.continuation  # type: ignore[attr-defined]
    train, train_ids = encode_prompts(data.train, renderer, d.max_prompt_tokens, d.skip_bad_rows, "training", log)
    if problem := renderer.check(train[0], train_ids[train[0].uid]):  # the start-up check, before training
        log(one_line(f"warning: prompt check (row {train[0].uid}): {problem}"))
    chat = renderer.templated
    if not data.held_out:
        return Prompts(train, train_ids, EvalSet([], []), chat)
    held_out, ids = encode_prompts(data.held_out, renderer, d.max_prompt_tokens, d.skip_bad_rows, "held-out", log)
    return Prompts(train, train_ids, EvalSet(held_out, [ids[e.uid] for e in held_out]), chat)


def encode_prompts(examples: list[Example], renderer: PromptRenderer, limit: int, skip_bad: bool,
                   split: str, log: Log) -> tuple[list[Example], dict[str, list[int]]]:
    """Tokenise every prompt once, up front, so a prompt longer than the context is reported (or,
    with data.skip_bad_rows, skipped and counted) before training starts, not hours into it."""
    kept, ids, too_long = [], {}, []
    most_chars = renderer.most_chars(limit)
    for example in examples:
        text = renderer.text(example)
        # Length first: a multi-megabyte row is refused (or skipped) without tokenizing it whole.
        tokens = renderer.encode(text) if len(text) <= most_chars else None
        if tokens is None or len(tokens) > limit:
            size = (f"{len(tokens)} tokens" if tokens is not None
                    else f"{len(text):,} characters (so over {limit} tokens)")
            too_long.append((example.uid, size))
            continue
        kept.append(example)
        ids[example.uid] = tokens
    if too_long and not skip_bad:
        uid, size = too_long[0]
        raise UserError(f"{split} prompt '{uid}' has {size}, more than data.max_prompt_tokens={limit} "
                        f"({len(too_long)} such prompts); raise the limit or set data.skip_bad_rows=true")
    if too_long:
        log(f"skipped {len(too_long)} {split} prompts longer than data.max_prompt_tokens={limit}")
    if not kept:
        raise UserError(f"no {split} prompts left (all {len(examples)} are longer than data.max_prompt_tokens)")
    return kept, ids


# -- models, engine, trainer -----------------------------------------------------------------------
@dataclass
class Models:
    gen: PreTrainedModel  # the generator's copy, in the generation dtype
    train: PreTrainedModel  # the fp32 master weights
    ref: PreTrainedModel | AdaptersOff | None  # the frozen KL reference (None when algo.kl_coef = 0)
    compute_dtype: torch.dtype  # the trainer's autocast dtype


def build_models(config: Config, start: str, resume_from: Path | None, gen_device: torch.device,
                 train_device: torch.device) -> Models:
    """`start` is the policy the run began from (the KL reference); `resume_from` a checkpoint
    whose weights to train from now (else `start`)."""
    if config.model.lora_rank:
        return build_lora_models(config, start, resume_from, gen_device, train_device)
    policy = str(resume_from / POLICY_DIR) if resume_from else start
    trust, allow_pickle = config.model.trust_remote_code, config.model.allow_pickle
    gen_dtype = resolve_dtype(config.model.dtype, gen_device)
    gen = load_model(policy, gen_dtype, gen_device, trust, allow_pickle=allow_pickle)
    train = load_model(policy, torch.float32, train_device, trust, allow_pickle=allow_pickle)
    if config.model.gradient_checkpointing:
        checkpoint_activations(train)
    compute_dtype = resolve_dtype(config.model.train_dtype, train_device)
    ref = None
    if config.algo.kl_coef > 0:  # coefficient 0 keeps no reference model at all
        source = (load_model(start, compute_dtype, train_device, trust, allow_pickle=allow_pickle) if resume_from
                  else copy.deepcopy(train))
        ref = source.to(compute_dtype).eval().requires_grad_(False)
    return Models(gen, train, ref, compute_dtype)


def build_lora_models(config: Config, start: str, resume_from: Path | None, gen_device: torch.device,
                      train_device: torch.device) -> Models:
    """LoRA (models/lora.py): the base loads once per side, frozen in the compute dtype on the trainer
    (bf16 on CUDA: no fp32 master of it), with adapters from `resume_from` or fresh ones; the
    generator holds the base, and the weight sync merges the adapters into it. The KL reference
    is the same model with its adapters off."""
    m = config.model
    adapter = resume_adapter(config, resume_from)
    gen = load_model(start, resolve_dtype(m.dtype, gen_device), gen_device, m.trust_remote_code,
                     allow_pickle=m.allow_pickle)
    compute_dtype = resolve_dtype(m.train_dtype, train_device)
    base = load_model(start, compute_dtype, train_device, m.trust_remote_code, allow_pickle=m.allow_pickle)
    peft_model = wrap(base, m, adapter)
    train = peft_model.get_base_model()
    if m.gradient_checkpointing:
        checkpoint_activations(train)
    ref = AdaptersOff(peft_model) if config.algo.kl_coef > 0 else None
    return Models(gen, train, ref, compute_dtype)


def resume_adapter(config: Config, resume_from: Path | None) -> Path | None:
    """The adapter/ a LoRA run continues from: None for a fresh run; a checkpoint without one is refused."""
    adapter = resume_from / ADAPTER_DIR if resume_from else None
    if adapter is not None and not adapter.is_dir():
        raise UserError(f"model.lora_rank={config.model.lora_rank}, but checkpoint {resume_from} holds no "
                        f"{ADAPTER_DIR}/ (a full fine-tuning run wrote it); resume it with model.lora_rank=0")
    return adapter


def context_length(model: PreTrainedModel, longest_prompt: int, new_tokens: int, what: str) -> int:
    """The engine's context: the longest prompt plus the longest completion, checked against the
    model's own context (`what` names the settings that set them, for the error)."""
    max_len = longest_prompt + new_tokens
    limit = getattr(model.config, "max_position_embeddings", max_len)
    if max_len > limit:
        raise UserError(f"{what} = {max_len} exceeds the model's context of {limit} tokens")
    return max_len


def engine_context(config: Config, model: PreTrainedModel, prompts: Prompts) -> int:
    """The engine's KV cache is sized by the longest prompt actually present, not by the configured limit."""
    longest = max(len(ids) for ids in [*prompts.train_ids.values(), *prompts.eval_set.prompt_ids])
    new_tokens = max(config.generation.max_new_tokens, config.eval.max_new_tokens or 0)
    return context_length(model, longest, new_tokens, "the longest prompt + generation.max_new_tokens")


def build_engine(config: Config, model: PreTrainedModel, eos: list[int], max_len: int,
                 compile: bool | None = None, timed: bool = True, seed: int | None = None,
                 fuse: bool = True, log: Log | None = None, backend: str | None = None,
                 prefix: tuple[int, ...] = ()) -> Backend:
    """The generation engine; `timed` records its phases for the metrics (a benchmark of the
    engine alone turns that off: on CUDA it costs two events per phase per step); `seed`: the
    sampling seed (default run.seed; each torchrun rank has its own); `fuse`: fused q/k/v and
    gate/up projections (generation/forward.py; `model` must be the generator's own copy); `prefix`:
    EngineOptions.prompt_prefix. `backend` (default generation.backend): the engine or the HF
    fallback (generation/backends.py); `log` hears, once, that a model runs on the fallback."""
    g, a = config.generation, config.algo
    kind, reason = choose(model, backend or g.backend, max_len)
    if kind == "hf" and log is not None:
        log(fallback_line(model, reason or ""))
    options = replace(engine_options(g, a.batch_groups * a.group_size, max_len, config.run.seed if seed is None else
                                     seed, next(model.parameters()).device, timed),
                      compile=g.compile if compile is None else compile, fuse=fuse, prompt_prefix=prefix)
    return make_engine(model, eos, options, backend or g.backend)


def check_engine(config: Config, engine: Backend, model: PreTrainedModel, eos: list[int], max_len: int,
                 prompt_ids: list[int], seed: int | None, log: Log) -> Backend:
    """The start-up check (generation/backends.py) on the real weights, with a short prompt: the
    backend to train with, or a one-line refusal. Under `auto` an engine that fails it gives way to
    the fallback, and generation.backend becomes `hf` for the evaluators built after it."""
    def fallback() -> Backend:
        config.generation.backend = "hf"
        return build_engine(config, model, eos, max_len, seed=seed, backend="hf")
    return checked(engine, model, prompt_ids[:16], config.generation.backend, fallback, log)


# (the trainer's policy module, its model, the compute dtype) -> the collective its sums use. One
# process keeps the whole model; a torchrun rank's cell shards it (run/sharded_cell.py).
Shard = Callable[[torch.nn.Module, PreTrainedModel, torch.dtype], Collective]


def keep_whole(policy: torch.nn.Module, model: PreTrainedModel, compute_dtype: torch.dtype) -> Collective:
    return LOCAL


def build_trainer(config: Config, models: Models, pad_id: int, shard: Shard = keep_whole) -> Trainer:
    """`shard` places the trainer's model before the optimizer is built on it (under torchrun: FSDP2
    over the ranks, and global normalisers and statistics)."""
    if config.train.lean_activations:  # before sharding: the probe runs the whole modules
        make_lean(models.train)
    policy = TokenLogprobs(models.train)
    collective = shard(policy, models.train, models.compute_dtype)
    if config.train.compile:  # after sharding: FSDP2's hooks stay eager around each compiled layer
        compile_layers(models.train)
    trainer = Trainer(models.train, config.algo, config.train, pad_id, ref_model=models.ref,
                      autocast_dtype=models.compute_dtype, temperature=config.generation.temperature,
                      loss_constant=config.generation.max_new_tokens, policy=policy, collective=collective)
    fp32 = models.gen.get_input_embeddings().weight.dtype == torch.float32 and trainer.autocast_dtype is None
    # A kept stale KV cache (generation.recompute_kv=false) is a gap the user chose: no default bound then.
    # bf16's tail: over 45 steps of SmolLM2's sums config (~3,000 tokens each) the per-step max gap
    # was 0.30-0.89 nats and once 1.28 (mean 0.036-0.041), so 1.0 stopped sound runs at random
    # (docs/log/2026-11-avx512-cpu.md); a wrong forward errs by nats on many tokens, far above 2.
    default = (0.05 if fp32 else 2.0) if config.generation.recompute_kv else math.inf
    trainer.max_logprob_gap = config.train.max_logprob_gap or default
    return trainer


def build_workers(engine: Backend, trainer: Trainer, gen_model: PreTrainedModel,
                  evaluate: Callable[[], dict[str, float]], one_thread: int | None = None,
                  stall_s: float = 0.0) -> tuple[EngineWorker, TrainerWorker]:
    """The generator and trainer threads, sharing the weight sync from trainer to generator. Build
    them after a resume restored the trainer: they start at its version. `one_thread`: both sides
    on one CPU thread with a team of that many intra-op threads (devices.one_cpu_team); `stall_s`:
    run.stall_timeout_s, the longest one call into either thread may take (orchestrator/workers.py)."""
    # With LoRA the generator receives merged weights, only of the adapted matrices (weightsync/full.py).
    # One thread in sync mode: the generator is idle whenever the trainer publishes, so no staging copy.
    if is_lora(trainer.model):
        sync: WeightSync = LoraSync(trainer.model, gen_model)
    else:
        sync = WeightSync(trainer.model, gen_model, staged=one_thread is None)
    sync.set_version(trainer.version)  # both sides now hold the weights of that version
    pool = thread_for(torch.device("cpu"), "torch", one_thread) if one_thread else None
    return EngineWorker(engine, sync, pool, stall_s), TrainerWorker(trainer, sync, evaluate, pool, stall_s)


def build_rewards(config: Config, task: Task, decode: Callable[[list[int]], str]) -> RewardService:
    r = config.reward
    return RewardService(build_scorer(r, task), decode, r.workers, r.timeout_s, memory_limit_mb=r.memory_limit_mb)
