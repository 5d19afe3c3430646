"""`python -m aioareal eval TARGET [TARGET ...] [-n K] [--temperature T] [section.key=value ...]`.

Scores each target (targets.py: a run, a checkpoint, a model) on the held-out prompts of the run's
data keys: one greedy completion per prompt, and with -n K also K sampled ones, on the generation
engine, through the reward service (evaluate/scored_completions.py). Prints one table, the targets side by side
(`eval BASE RUN`: before and after), writes every completion to OUT/eval.jsonl and the figures to
OUT/figures.json, and prints the figures' JSON line last. The figures: evaluate/pass_at_k.py;
docs/evaluate.md says what each means."""
from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import Config
from ..devices import resolve_device
from ..errors import UserError, guarded
from ..evaluate.answers import answer_reader
from ..evaluate.pass_at_k import PromptVerdicts, completion_figures, sampled_figures
from ..evaluate.scored_completions import Scored, generate, score
from ..generation import SamplingParams
from ..io import append_jsonl, atomic_write_text
from ..models import eos_token_ids, load_model, load_tokenizer, resolve_dtype
from ..run.build import build_data, build_rewards, encode_prompts
from ..tasks import PromptRenderer
from .eval_report import Progress, json_line, table
from .targets import Target, model_source, resolve, target_config

OVERRIDE = re.compile(r"[a-z_]+\.[a-z_0-9]+=")  # section.key=value, as training takes it


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m aioareal eval",
                                description="Score runs, checkpoints or models on the held-out prompts, side by side.",
                                epilog="Data keys (data.task, data.eval_size, ...) come from the first run's "
                                       "config.yaml or --config; override them as section.key=value.")
    p.add_argument("items", nargs="+", metavar="TARGET",
                   help="a run dir, a checkpoint dir, or a model (tiny, smollm2-135m-instruct, gemma3-270m, a dir, "
                   "a .gguf)")
    p.add_argument("-n", type=int, default=0, metavar="K", help="sampled completions per prompt (0: greedy only)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for -n (default 1.0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling for -n (default 1.0)")
    p.add_argument("--max-new-tokens", type=int, help="completion limit (default eval.max_new_tokens, "
                   "else generation.max_new_tokens)")
    p.add_argument("--pass-threshold", type=float, default=1.0,
                   help="a completion passes when its reward is at least this (default 1: the verifier's full score)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--out", help="output directory for eval.jsonl and figures.json (default runs/eval-<time>)")
    p.add_argument("--config", help="YAML config whose data keys to use (instead of the first run's)")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    return p


def split_items(items: list[str]) -> tuple[list[str], list[str]]:
    """(targets, section.key=value overrides)."""
    overrides = [i for i in items if OVERRIDE.match(i)]
    return [i for i in items if not OVERRIDE.match(i)], overrides


def main(argv: list[str]) -> int:
    args = parser().parse_intermixed_args(argv)
    return guarded(args.debug, lambda: run_eval(args))


def run_eval(args: argparse.Namespace) -> int:
    names, overrides = split_items(args.items)
    if not names:
        raise UserError("eval needs at least one TARGET (a run dir, a checkpoint dir or a model)")
    if args.n < 0:
        raise UserError(f"-n must be >= 0 (0: greedy only), got {args.n}")
    if args.temperature <= 0 or not 0 < args.top_p <= 1:
        raise UserError("--temperature must be > 0 and --top-p in (0, 1]")
    targets = [resolve(name) for name in names]
    config, start = target_config(targets, args.config, overrides)
    if config.data.episode:
        raise UserError(f"data.episode={config.data.episode}: eval scores single completions; a run with "
                        "episodes evaluates greedy episodes itself (eval_pass_rate in metrics.jsonl)")
    new_tokens = args.max_new_tokens or config.eval.max_new_tokens or config.generation.max_new_tokens
    out = Path(args.out) if args.out else Path("runs") / time.strftime("eval-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    columns = []
    with (out / "eval.jsonl").open("w", encoding="utf-8") as records:
        for target in targets:
            columns.append(evaluate_target(target, config, start, args, new_tokens, records))
    figures = {"task": config.data.task, "n": args.n, "temperature": args.temperature if args.n else None,
               "max_new_tokens": new_tokens, "targets": columns}
    line = json_line(figures)
    atomic_write_text(out / "figures.json", line + "\n")
    print(table(columns, args.n))
    for column in columns:
        if column["reward_failures"]:
            print(f"warning: {column['target']}: {column['reward_failures']} reward checks failed (raised, hung "
                  "past reward.timeout_s or returned garbage) and scored 0")
    print(f"completions: {out / 'eval.jsonl'}; figures: {out / 'figures.json'}")
    print(line)
    return 0


def evaluate_target(target: Target, config: Config, start: Config, args: argparse.Namespace, new_tokens: int,
                    records: Any) -> dict[str, Any]:
    """Generate, score and summarise one target; its completions are appended to `records`
    (`start`: the config without overrides, for the `tiny` target's warm-start)."""
    source = model_source(target, start)
    m = config.model
    device = resolve_device(config.rollout.gen_device, "gen")
    tokenizer = load_tokenizer(source, m.trust_remote_code)
    model = load_model(source, resolve_dtype(m.dtype, device), device, m.trust_remote_code, allow_pickle=m.allow_pickle)
    task, examples, ids = held_out(config, tokenizer)
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    eos = eos_token_ids(model, tokenizer)
    service = build_rewards(config, task, decode)
    phases = [("greedy", 1, SamplingParams(greedy=True, max_new_tokens=new_tokens))]
    if args.n:
        phases.append((f"n={args.n}", args.n, SamplingParams(args.temperature, args.top_p, new_tokens)))
    results, failures = {}, {}
    for phase, size, params in phases:
        progress = Progress(f"{target.label} {phase}", len(examples))
        completions = generate(model, eos, ids, examples, size, params, args.seed, progress)
        progress.close()
        results[phase], failures[phase] = score(service, decode, completions, examples)
    service.close()
    read = answer_reader(task)
    verdicts = {phase: [verdicts_of(group, args.pass_threshold, read) for group in scored]
                for phase, scored in results.items()}
    append_jsonl(records, [row for phase, scored in results.items()
                           for row in rows_of(target.label, examples, scored, verdicts[phase], phase == "greedy")])
    figures: dict[str, Any] = {"target": target.label, "model": source, "prompts": len(examples),
                               "reward_failures": sum(failures.values())}
    figures.update(completion_figures(verdicts["greedy"], "_greedy"))
    if args.n:
        figures.update(completion_figures(verdicts[f"n={args.n}"]))
        figures.update(sampled_figures(verdicts[f"n={args.n}"]))
    return figures


def held_out(config: Config, tokenizer: Any) -> tuple[Any, list, list[list[int]]]:
    """The task, its held-out examples and their prompt ids, rendered as training renders them."""
    d = config.data
    if d.task == "file" and d.path is None and d.eval_path is not None:
        config = replace(config, data=replace(d, path=d.eval_path))  # eval reads no training rows
    data = build_data(config, log=lambda _: None)
    if not data.held_out:
        raise UserError(f"data.task={config.data.task} has no held-out prompts (data.eval_size=0 and no "
                        "data.eval_path or data.eval_split); set one")
    d = config.data
    chat = data.task.chat if d.chat_template is None else d.chat_template
    renderer = PromptRenderer(tokenizer, chat, d.system_prompt, d.prompt_template)
    examples, ids = encode_prompts(data.held_out, renderer, d.max_prompt_tokens, d.skip_bad_rows, "held-out",
                                   log=lambda _: None)
    if problem := renderer.check(examples[0], ids[examples[0].uid]):  # the start-up check, as training's
        print(f"warning: prompt check (row {examples[0].uid}): {problem}", file=sys.stderr, flush=True)
    return data.task, examples, [ids[e.uid] for e in examples]


def verdicts_of(group: list[Scored], threshold: float, read: Any) -> PromptVerdicts:
    return PromptVerdicts([s.reward for s in group], [s.reward >= threshold for s in group],
                          [s.length for s in group], [s.truncated for s in group],
                          [read(s.text) for s in group] if read else [])


def rows_of(label: str, examples: list, scored: list[list[Scored]], verdicts: list[PromptVerdicts],
            greedy: bool) -> list[dict[str, Any]]:
    """eval.jsonl: one row per completion."""
    return [{"target": label, "prompt_id": ex.uid, "greedy": greedy, "sample": i, "text": s.text,
             "reward": s.reward, "passed": v.passed[i], "answer": v.answers[i] if v.answers else None,
             "reference": ex.answer, "prompt": ex.prompt, "length": s.length, "truncated": s.truncated}
            for ex, group, v in zip(examples, scored, verdicts) for i, s in enumerate(group)]
