"""Supervised warm-start of the offline tiny model, cached under runs/_warmup/.

Random weights earn no reward, so RL cannot start from them. Like an instruct model before RL,
the tiny model is first taught the task's format and a little skill by supervised training on
the arithmetic *training* split, and stopped as soon as its held-out greedy pass rate reaches
`warmup.target_pass_rate` (default 0.3): good enough for RL to find rewarded samples, far from
solved. It is the `sft` stage's loss on the stage's demonstrations (run/sft.py), with its own
sampling of sums and its stopping rule; the result is saved with `save_pretrained` and loaded like
any hub model.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..config import Config, ToolsConfig
from ..episodes import EpisodeSetup, codec_for, load_episode
from ..episodes.runner import RAW_CALL, RAW_END, RAW_RESULT
from ..evaluation.scored_completions import EvalSet, evaluate
from ..group import Example
from ..io import exclusive_lock
from ..models.load_policy import eos_token_ids, random_model
from ..models.prompt_encoding import PromptEncoder
from ..models.shapes import SHAPES, build_char_tokenizer
from ..rewards.service import RewardService, per_item
from ..tasks.arithmetic import ArithmeticTask
from ..trainer.objective import Demo, completion_loss

FORMAT = 1  # bump when the warm-start recipe changes, so stale caches are not reused
PROGRESS_EVERY_S = 10.0  # a progress line at the first evaluation this long after the last
EVAL_EVERY = 25
SUMMARY_FILE = "warmup.json"  # written last: a directory holding it is a finished warm-start


def cache_root() -> Path:
    return Path(os.environ.get("AIOAREAL_WARMUP_DIR", "runs/_warmup"))


def cache_key(config: Config) -> str:
    d = config.data
    warmup = asdict(config.warmup)
    later = (("ops", ""), ("digits", 0), ("calls", False), ("extra_ops", ""), ("extra_digits", 1),
             ("extra_calls", 0.0))
    for key, default in later:  # fields added later: at their defaults the old keys stay valid
        if warmup[key] == default:
            del warmup[key]
    spec = dict(format=FORMAT, shape=SHAPES["tiny"], warmup=warmup, digits=config.arithmetic.digits,
                ops=config.arithmetic.ops, eval_size=d.eval_size, shuffle_seed=d.shuffle_seed)
    if config.arithmetic.max_operand:  # added later: at its default the old keys stay valid
        spec["max_operand"] = config.arithmetic.max_operand
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def ensure_tiny(config: Config, log=print) -> Path:
    """Path of the warm-started tiny model for this config, training it first if not cached."""
    path = cache_root() / f"tiny-{cache_key(config)}"
    if (path / SUMMARY_FILE).exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(path.parent / f".{path.name}.lock"):  # concurrent runs wait for one warm-start, not redo it
        if not (path / SUMMARY_FILE).exists():
            log(f"warm-start: training the tiny model once (cached in {path})")
            tmp = path.with_name(path.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            summary = train_tiny(config, tmp, log)
            (tmp / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
            os.replace(tmp, path)
    return path


def train_tiny(config: Config, out: Path, log=print) -> dict:
    w = config.warmup
    rng = random.Random(0)
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    model = random_model("tiny", torch.float32, torch.device("cpu"), seed=0)
    sets = warmup_sets(config)
    train, held_out, extra = sets.train, sets.held_out, sets.extra
    prompt = PromptEncoder(tokenizer)  # raw prompts; answers continue them (models/prompt_encoding.py)
    encode = prompt.continuation
    evaluate_now = _evaluator(config, sets.task, EvalSet(held_out, [prompt(e.prompt) for e in held_out]), tokenizer,
                              eos_token_ids(model, tokenizer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=w.lr, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 100))
    start, pass_rate, step = time.time(), 0.0, 0
    said = start
    for step in range(1, w.max_steps + 1):
        k = w.batch_size // 4 if extra else 0  # warmup.extra_ops: a quarter of the batch
        batch = rng.sample(train, w.batch_size - k) + rng.choices(extra, k=k)
        calls = [w.calls] * (w.batch_size - k) + [w.calls and rng.random() < w.extra_calls for _ in range(k)]
        answers = [_answer(e, c, encode, tokenizer.eos_token_id) for e, c in zip(batch, calls)]
        demos = [Demo(prompt(e.prompt), a, t) for e, (a, t) in zip(batch, answers)]
        loss, tokens = completion_loss(model, demos, torch.device("cpu"))  # the sft stage's loss (run/sft.py)
        loss = loss / tokens
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % EVAL_EVERY == 0:
            pass_rate = evaluate_now(model)
            if pass_rate >= w.target_pass_rate:
                break
            if time.time() - said > PROGRESS_EVERY_S:  # never silent for long: it takes a minute or more
                said = time.time()
                log(f"warm-start: step {step} of at most {w.max_steps}, held-out pass rate {pass_rate:.3f} "
                    f"(stops at {w.target_pass_rate}), {said - start:.0f} s")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    summary = {"steps": step, "held_out_pass_rate": pass_rate, "seconds": round(time.time() - start, 1)}
    log(f"warm-start: {step} steps, held-out pass rate {pass_rate:.3f}, {summary['seconds']} s")
    return summary


@dataclass
class WarmupSets:
    """What the warm-start takes from the arithmetic task, all at once (tasks/arithmetic.py)."""

    task: ArithmeticTask  # its exact-match verdict
    train: list[Example]
    held_out: list[Example]
    extra: list[Example]  # warmup.extra_ops


def warmup_sets(config: Config) -> WarmupSets:
    train, held_out = warmup_examples(config)
    return WarmupSets(ArithmeticTask(ops=config.warmup.ops or config.arithmetic.ops), train, held_out,
                      extra_examples(config))


def warmup_examples(config: Config, pool: int = 50_000) -> tuple[list[Example], list[Example]]:
    """The warm-start's training and held-out examples. With warmup.digits: warmup.ops (or the task's)
    on operands of 1 to warmup.digits digits, each length equally likely, so that a call learns to copy
    numbers of any length (not only the longest, which uniform draws give nine times in ten), and
    results as long as the task's; without it, the task's own splits."""
    w, d, a = config.warmup, config.data, config.arithmetic
    ops = w.ops or a.ops
    if not w.digits:
        return ArithmeticTask(a.digits, ops, d.eval_size, d.shuffle_seed, max_operand=a.max_operand).splits()
    rng = random.Random(d.shuffle_seed)
    seen: dict[tuple[int, str, int], None] = {}  # distinct triples, in the order drawn
    for _ in range(4 * pool):  # bounded: few digits have fewer than `pool` distinct triples
        op = rng.choice(ops)
        seen[(_operand(rng, w.digits), op, _operand(rng, w.digits, nonzero=op == "%"))] = None
        if len(seen) == pool:
            break
    examples = [ArithmeticTask.example(*t) for t in seen]
    return examples[d.eval_size:], examples[: d.eval_size]


def extra_examples(config: Config, pool: int = 20_000) -> list[Example]:
    """warmup.extra_ops with one operand of 1 to warmup.extra_digits digits and the other of 1 to
    warmup.digits (the task's digits without it), in either order (12345*67, 67*12345): an operation
    the warm-start teaches on short operands only."""
    w = config.warmup
    if not w.extra_ops:
        return []
    rng = random.Random(config.data.shuffle_seed + 1)
    examples = []
    for _ in range(pool):
        op = rng.choice(w.extra_ops)
        long, short = _operand(rng, w.digits or config.arithmetic.digits), _operand(rng, w.extra_digits, op == "%")
        examples.append(ArithmeticTask.example(*((long, op, short) if rng.random() < 0.5 or op == "%"
                                                 else (short, op, long))))
    return examples


def _operand(rng: random.Random, digits: int, nonzero: bool = False) -> int:
    n = rng.randint(1, digits)  # the length first: every length equally likely
    return rng.randrange(max(10 ** (n - 1) if n > 1 else 0, int(nonzero)), 10 ** n)


def _answer(example, calls: bool, encode, eos: int) -> tuple[list[int], list[bool]]:
    """What the model learns to write after the prompt, and which tokens it is taught (the calculator's
    result is an observation: context, never a target). With `calls`, the calculator episode's raw
    format (episodes/runner.py): 23+45=[23+45]{68}68<eos>"""
    if not calls:
        ids = encode(example.answer) + [eos]
        return ids, [True] * len(ids)
    segments = [(encode(f"{RAW_CALL}{example.prompt.rstrip('=')}{RAW_END}"), True),
                (encode(RAW_RESULT.format(example.answer)), False), (encode(example.answer) + [eos], True)]
    return [t for ids, _ in segments for t in ids], [m for ids, m in segments for _ in ids]


def _evaluator(config: Config, task: ArithmeticTask, eval_set: EvalSet, tokenizer, eos: list[int]):
    """Held-out greedy pass rate: single completions, or with warmup.calls the calculator episode with
    its tool (no simulated latency: the warm-start's clock is not the experiment's)."""
    if not config.warmup.calls:
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        rewards = RewardService(per_item(task.score), decode)  # exact match: bounded, in the service's threads
        return lambda model: evaluate(model, eval_set, rewards, eos, max_new_tokens=8).pass_rate
    from ..evaluation.episode_eval import evaluate_episodes

    setup = EpisodeSetup("calculator", load_episode("calculator"), codec_for(tokenizer, False), ToolsConfig(),
                         config.data.episode_timeout_s, config.run.seed, lambda _: None)
    budget, backend = config.generation.max_new_tokens, config.generation.backend
    return lambda model: evaluate_episodes(setup, model, eval_set, task.score, eos, budget, backend)["eval_pass_rate"]
