"""Supervised fine-tuning, the stage before RL (`python -m aioareal sft`; docs/sft.md): a model taught to
write demonstrations, for a model that earns too little reward for RL to learn from.

Demonstrations are prompt/completion pairs: a file's rows (sft.path), or the task's own (GSM8K's train
solutions, their calculator annotations dropped, ending in the boxed answer its grader reads; the
arithmetic task's answers). Prompts are rendered as RL renders them (the task's chat template, the
tokenizer's BOS: tasks/base.py PromptRenderer); a completion continues its prompt and ends in EOS. The
loss is the mean next-token loss over completion tokens only, by the trainer's own log-probs
(trainer/logprobs.py: the LM head in chunks, a 262k vocabulary never whole).

The run directory is laid out as an RL run's: config.yaml, metrics.jsonl (a row per step, held-out
loss rows), checkpoints/step-N/policy written atomically (checkpoint/atomic.py). An RL run starts from
it with model.name=RUN. `--resume RUN` continues from the latest checkpoint with the optimizer state
and the data order (a seeded permutation per epoch; the cursor in state.json), so a run killed at any
moment neither loses nor repeats a step.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from .. import checkpoint
from ..checkpoint import RunState
from ..checkpoint.atomic import own_run_dir, release_run_dir
from ..checkpoint.resume_plan import decide, resume_config
from ..config import Config, load_config, save_config
from ..devices import resolve_device
from ..errors import UserError, guarded
from ..group import Example
from ..io import atomic_write_text
from ..models.load_policy import END_OF_TURN, load_model, load_tokenizer, resolve_dtype
from ..models.lora import describe, wrap
from ..monitor.metrics import RunLog
from ..tasks import PromptRenderer
from ..tasks.rows import field_value, read_file
from ..trainer.objective import Demo, completion_loss
from ..trainer.optim import build_optimizer, freeze_embeddings
from ..trainer.trainer import autocasts
from .build import build_data, model_path, resume_adapter, task_from

Log = Callable[[str], None]
_CALCULATOR = re.compile(r"<<[^>]*>>")  # GSM8K's calculator annotations: 48/2 = <<48/2=24>>24
FINAL_LR = 0.1  # the schedule decays linearly to this fraction of sft.lr at sft.steps


def boxed_solution(solution: str) -> str:
    """A GSM8K solution as a demonstration: the annotations dropped, the `#### N` line replaced by the
    sentence the boxed-answer grader reads."""
    body, marker, final = solution.rpartition("####")
    if not marker:
        return solution.strip()
    return f"{_CALCULATOR.sub('', body).strip()}\nThe final answer is \\boxed{{{final.strip()}}}."


def demonstration_examples(config: Config, log: Log) -> list[Example]:
    """Every demonstration as an Example whose `answer` is the completion to teach."""
    s = config.sft
    if s.path is not None:
        examples = []
        for i, (where, row) in enumerate(read_file(s.path)):
            prompt = field_value(row, s.prompt_field, where)
            completion = field_value(row, s.completion_field, where)
            examples.append(Example(uid=f"sft-{i}", prompt=str(prompt), answer=str(completion), row=row))
        return examples
    data = build_data(config, log)  # the task's training rows: never its held-out ones
    if data.task.name == "gsm8k":
        return [replace(e, answer=boxed_solution(e.answer)) for e in data.train]
    return list(data.train)


def demonstrations(config: Config, tokenizer: Any, log: Log) -> tuple[list[Demo], list[Demo]]:
    """(training, held-out) demonstrations as token ids; those longer than sft.max_tokens are left out."""
    d, s = config.data, config.sft
    examples = demonstration_examples(config, log)
    chat = d.chat_template if d.chat_template is not None else (s.path is not None or _task_chat(config))
    renderer = PromptRenderer(tokenizer, chat, d.system_prompt, d.prompt_template)
    vocab = tokenizer.get_vocab()
    turn_end = next((vocab[t] for t in END_OF_TURN if t in vocab), None) if renderer.templated else None
    eos = turn_end if turn_end is not None else tokenizer.eos_token_id  # a chat reply ends its turn
    if eos is None:
        raise UserError("sft: the tokenizer defines no end-of-sequence token to end a completion with; set one "
                        "in its tokenizer config")
    demos, long = [], 0
    for e in examples:
        demo = Demo(renderer.ids(e), renderer.encoder.continuation(e.answer) + [eos])
        if len(demo.prompt) + len(demo.completion) > s.max_tokens:
            long += 1
            continue
        demos.append(demo)
    if long:
        log(f"sft: {long} of {len(examples)} demonstrations are longer than sft.max_tokens={s.max_tokens}: left out")
    if len(demos) <= s.eval_size:
        raise UserError(f"sft: {len(demos)} demonstrations fit in sft.max_tokens={s.max_tokens}, none left to train "
                        f"on after sft.eval_size={s.eval_size} held out")
    random.Random(config.run.seed).shuffle(demos)
    return demos[s.eval_size:], demos[:s.eval_size]


def _task_chat(config: Config) -> bool:
    return bool(task_from(config).chat)


def batch_at(cursor: int, size: int, count: int, seed: int) -> list[int]:
    """Demonstrations `cursor` .. `cursor + size` of the run's order: each epoch a permutation of the
    `count` of them seeded by (seed, epoch), so the order is a function of the cursor alone."""
    out, orders = [], {}
    for i in range(cursor, cursor + size):
        epoch = i // count
        if epoch not in orders:
            order = list(range(count))
            random.Random(f"{seed}-{epoch}").shuffle(order)
            orders[epoch] = order
        out.append(orders[epoch][i % count])
    return out


def schedule(step: int, s: Any) -> float:
    """The learning rate of optimizer step `step` (from 1): linear warm-up, then linear decay."""
    if step <= s.warmup_steps:
        return s.lr * step / s.warmup_steps
    span = max(1, s.steps - s.warmup_steps)
    return s.lr * (1 - (1 - FINAL_LR) * min(1.0, (step - s.warmup_steps) / span))


@torch.no_grad()
def held_out_loss(model: Any, demos: list[Demo], micro: int, device: torch.device) -> float:
    if not demos:
        return math.nan
    total, tokens = 0.0, 0
    model.eval()
    for i in range(0, len(demos), micro):
        loss, n = completion_loss(model, demos[i:i + micro], device)
        total, tokens = total + float(loss), tokens + n
    model.train()
    return total / max(tokens, 1)


def _trainee(config: Config, base: str, resume_from: Path | None,
             device: torch.device) -> tuple[Any, list, torch.optim.Optimizer, Any]:
    """The model to train, its trained parameters, their AdamW and the forward's autocast context.
    Full fine-tuning keeps fp32 master weights, as RL's trainer does (run/build.py): Adam's steps of
    about lr are below a bf16 weight's rounding step, and would be lost. With model.lora_rank > 0 only
    the adapters train (fp32), the frozen base held in the compute dtype on CUDA as RL's LoRA holds it
    (fp32 on the CPU, where autocast casts it per op anyway and a bf16 base would round the merged
    policy's small updates away); a resume loads the base again plus the checkpoint's adapter/
    (whose PEFT files alone load as the policy: models/lora.py). The forward autocasts to
    model.train_dtype by the trainer's rule (bf16 or fp16 on CUDA, bf16 on the CPU)."""
    m = config.model
    torch.manual_seed(config.run.seed)
    compute = resolve_dtype(m.train_dtype, device)
    cast = torch.autocast(device.type, dtype=compute) if autocasts(device, compute) else contextlib.nullcontext()
    if m.lora_rank:
        held = compute if device.type == "cuda" else torch.float32  # the CPU's merged policy/ keeps fp32's precision
        frozen = load_model(base, held, device, m.trust_remote_code, allow_pickle=m.allow_pickle)
        model = wrap(frozen, m, resume_adapter(config, resume_from)).get_base_model()
    else:
        source = str(resume_from / checkpoint.POLICY_DIR) if resume_from else base
        model = load_model(source, torch.float32, device, m.trust_remote_code, allow_pickle=m.allow_pickle)
    model.train()
    algo = replace(config.algo, lr=config.sft.lr)
    freeze_embeddings(model, algo)  # algo.embedding_lr_scale=0, as in RL
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, algo, "float32", False, model)
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]  # the peak of each group (the embedding's may be scaled)
    return model, params, optimizer, cast


def train_sft(config: Config, run_dir: Path, log: Log = print, resume_from: Path | None = None) -> Path:
    """Fine-tune config.model on the demonstrations into `run_dir`; returns the last checkpoint."""
    s, m = config.sft, config.model
    device = resolve_device(config.rollout.train_device, "train")
    base = model_path(config, log)
    tokenizer = load_tokenizer(str(resume_from / checkpoint.POLICY_DIR) if resume_from else base, m.trust_remote_code)
    train, held = demonstrations(config, tokenizer, log)
    model, params, optimizer, cast = _trainee(config, base, resume_from, device)
    if m.lora_rank:
        log(f"sft: {describe(model)}")
    state = RunState(step=0, cursor=0, elapsed=0.0)
    if resume_from is not None:
        state = checkpoint.load_state(resume_from)
        optimizer.load_state_dict(checkpoint.load_trainer_state(resume_from, device)["optimizer"])
        log(f"sft: resuming {run_dir} from step {state.step}")
    metrics = RunLog(run_dir, resume_step=state.step if resume_from else None)
    log(f"sft: {len(train)} demonstrations ({len(held)} held out), {s.steps} steps of {s.batch_size}, lr {s.lr:g}")
    if state.step == 0:
        with cast:
            metrics.step({"step": 0, "eval_loss": held_out_loss(model, held, s.micro_batch, device), "time": 0.0})
    started = time.time() - state.elapsed
    latest = resume_from
    try:
        for step in range(state.step + 1, s.steps + 1):
            picked = [train[i] for i in batch_at(state.cursor, s.batch_size, len(train), config.run.seed)]
            with cast:
                loss, tokens = _optimizer_step(model, optimizer, params, picked, schedule(step, s) / s.lr, config,
                                               device)
            state = RunState(step=step, cursor=state.cursor + s.batch_size, elapsed=time.time() - started)
            row: dict[str, Any] = {"step": step, "loss": loss, "lr": schedule(step, s), "tokens": tokens,
                                   "time": round(state.elapsed, 2)}
            if step == s.steps or (s.eval_every and step % s.eval_every == 0):
                with cast:
                    row["eval_loss"] = held_out_loss(model, held, s.micro_batch, device)
            metrics.step(row)
            log(_line(row, s.steps))
            every = config.run.checkpoint_every
            if step == s.steps or (every and step % every == 0):
                trainer_state = {"optimizer": optimizer.state_dict(), "step": step}
                latest = checkpoint.save(run_dir, state, model, tokenizer, trainer_state, {},
                                         config.run.keep_checkpoints)
    finally:
        metrics.close()
    checkpoint.mark_done(run_dir, s.steps)
    return latest if latest is not None else checkpoint.latest_checkpoint(run_dir)


def _optimizer_step(model: Any, optimizer: torch.optim.Optimizer, params: list[torch.Tensor], demos: list[Demo],
                    factor: float, config: Config, device: torch.device) -> tuple[float, int]:
    """One step over the batch, gradients accumulated over micro-batches, the loss a mean over all of
    the batch's completion tokens (each token weighs the same, whichever micro-batch holds it)."""
    tokens = sum(len(d.completion) if d.taught is None else sum(d.taught) for d in demos)
    demos = sorted(demos, key=lambda d: len(d.prompt) + len(d.completion))  # micro-batches of like lengths pad less
    total = 0.0
    optimizer.zero_grad(set_to_none=True)
    for i in range(0, len(demos), config.sft.micro_batch):
        loss, _ = completion_loss(model, demos[i:i + config.sft.micro_batch], device)
        (loss / tokens).backward()
        total += float(loss.detach())
    if config.algo.grad_clip:
        torch.nn.utils.clip_grad_norm_(params, config.algo.grad_clip)
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * factor
    optimizer.step()
    return total / tokens, tokens


def _line(row: dict[str, Any], steps: int) -> str:
    held = f"  held-out loss {row['eval_loss']:.4f}" if "eval_loss" in row else ""
    return f"sft step {row['step']}/{steps}  loss {row['loss']:.4f}  lr {row['lr']:.2e}  {row['time']:.0f} s{held}"


def sft(config: Config, log: Log = print, resume: Path | None = None) -> Path:
    """A fresh SFT run into run.run_dir (default runs/sft-<time>), or `resume` continued."""
    run_dir = resume or Path(config.run.run_dir or time.strftime("runs/sft-%Y%m%d-%H%M%S"))
    own_run_dir(run_dir)
    try:
        latest = None
        if resume is not None:
            if not (run_dir / checkpoint.SFT_MARKER).is_file():
                raise UserError(f"--resume {run_dir}: not an sft run (an RL run continues with "
                                f"python -m aioareal --resume {run_dir})")
            action, latest = decide(run_dir, config.sft.steps, log)
            if action == "done":
                return run_dir
        else:
            from .recipe import check_fresh_run_dir

            check_fresh_run_dir(run_dir)
        save_config(config, run_dir / "config.yaml")
        atomic_write_text(run_dir / checkpoint.SFT_MARKER, "")  # by rename: a planted link is replaced, not followed
        last = train_sft(config, run_dir, log, latest)
        log(f"sft written to {run_dir}; its policy: {last / checkpoint.POLICY_DIR}\n"
            f"start RL from it:  python -m aioareal model.name={run_dir} ...\n"
            f"evaluate it:       python -m aioareal eval {run_dir}")
        return run_dir
    finally:
        release_run_dir(run_dir)


def main(argv: list[str]) -> int:
    """`python -m aioareal sft [--config FILE] [--run-dir DIR | --resume DIR] [section.key=value ...]`."""
    p = argparse.ArgumentParser(prog="python -m aioareal sft",
                                description="Supervised fine-tuning on demonstrations, the stage before RL: "
                                "sft.path's prompt/completion rows, or the task's own (GSM8K's solutions).",
                                epilog="Keys: python -m aioareal config --keys sft (and model, data, run). "
                                "Start RL from the result with model.name=RUN_DIR.")
    p.add_argument("--config", help="YAML config file (see configs/)")
    p.add_argument("--run-dir", help="output directory (default runs/sft-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted SFT run from its latest checkpoint")
    p.add_argument("--force", action="store_true", help="with --resume: accept a changed config")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = p.parse_intermixed_args(argv)

    def go() -> int:
        flags = {"run.run_dir": args.run_dir}
        if args.resume:
            if args.config:
                raise UserError("--resume uses the run's own config.yaml; drop --config (overrides are allowed)")
            sft(resume_config(Path(args.resume), args.overrides, flags, args.force), resume=Path(args.resume))
        else:
            sft(load_config(args.config, args.overrides, flags))
        return 0
    return guarded(args.debug, go)
