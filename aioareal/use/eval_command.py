"""`python -m aioareal eval TARGET [TARGET ...] [--protocol P[,P]] [-n K] [--k K[,K]] [section.key=value ...]`.

Scores each target (targets.py: a run, a checkpoint, a model) on the held-out prompts of the run's
data keys, by each protocol asked for:
- `zero-shot` (the default): the prompts as training renders them, one greedy completion each, and with
  -n K also K sampled ones, scored by the task's grader through the reward service
  (evaluation/scored_completions.py), as training scores and as the in-run evaluation scores;
- `lm-eval`: GSM8K as lm-evaluation-harness scores it, 5-shot, greedy (evaluation/lm_eval.py).
Prints one table, the targets side by side (`eval BASE RUN`: before and after), a section per
protocol; writes every completion to OUT/eval.jsonl and the figures to OUT/figures.json, and prints
the figures' JSON line last. The figures: evaluation/scored_completions.py; docs/evaluate.md says what each means."""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..checkpoint.atomic import own_run_dir, release_run_dir
from ..config import Config
from ..config.limits import GROUP_MAX, check_flag
from ..devices import resolve_device
from ..errors import UserError, guarded, one_line
from ..evaluation import lm_eval
from ..evaluation.scored_completions import (
    PromptVerdicts,
    Scored,
    answer_reader,
    completion_figures,
    failures_line,
    generate,
    held_out_rewards,
    ks_up_to,
    mean_se,
    sampled_figures,
    score,
)
from ..generation import SamplingParams
from ..generation.scheduler import StopStrings
from ..io import append_jsonl, atomic_write_text
from ..models.load_policy import eos_token_ids, load_model, load_tokenizer, resolve_dtype
from ..models.prompt_encoding import PromptEncoder
from ..run.build import build_data, encode_prompts
from ..tasks import PromptRenderer
from .eval_journal import Journal, phase_key, weights_stamp
from .eval_report import Progress, json_line, sections, table
from .targets import Target, model_source, resolve, target_config

OVERRIDE = re.compile(r"[a-z_]+\.[a-z_0-9]+=")  # section.key=value, as training takes it
PROTOCOLS = ("zero-shot", "lm-eval")
CUT_OFF_WARNING = 0.5  # a zero-shot score with this share of its greedy answers cut short measures the limit


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m aioareal eval",
                                description="Score runs, checkpoints or models on the held-out prompts, side by side.",
                                epilog="Data keys (data.task, data.eval_size, ...) come from the first run's "
                                       "config.yaml or --config; override them as section.key=value.")
    p.add_argument("items", nargs="+", metavar="TARGET",
                   help="a run dir, a checkpoint dir, or a model (tiny, smollm2-135m-instruct, gemma3-270m, a dir, "
                   "a .gguf)")
    p.add_argument("--protocol", default="zero-shot", metavar="P[,P]",
                   help="how to prompt and score, comma-separated: zero-shot (the run's prompts and grader; "
                   "default), lm-eval (GSM8K 5-shot as lm-evaluation-harness scores it: model cards' figure)")
    p.add_argument("-n", type=int, default=0, metavar="K", help="sampled completions per prompt (0: greedy only)")
    p.add_argument("--k", metavar="K[,K]", help="the k of pass@k and maj@k, comma-separated, each at most -n "
                   "(default: the powers of two below -n, and -n)")
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


def check_flags(args: argparse.Namespace) -> None:
    """The ranges training takes for the keys these flags stand for (config/limits.py): a NaN, infinite or
    1e-300 temperature, a limit below one token or a seed no RNG takes is one line here, not a traceback
    in generation."""
    check_flag("--temperature", "eval.temperature", args.temperature)
    if not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.max_new_tokens is not None:
        check_flag("--max-new-tokens", "generation.max_new_tokens", args.max_new_tokens)
    if not math.isfinite(args.pass_threshold):
        raise UserError(f"--pass-threshold must be a finite reward, got {args.pass_threshold}")
    check_flag("--seed", "run.seed", args.seed)


def run_eval(args: argparse.Namespace) -> int:
    names, overrides = split_items(args.items)
    if not names:
        raise UserError("eval needs at least one TARGET (a run dir, a checkpoint dir or a model)")
    if not 0 <= args.n <= GROUP_MAX:
        raise UserError(f"-n must be in [0, {GROUP_MAX}] (0: greedy only; pass@k needs far fewer), got {args.n}")
    check_flags(args)
    args.protocols = parse_protocols(args.protocol)
    args.ks = parse_ks(args.k, args.n)
    if args.n and "zero-shot" not in args.protocols:
        raise UserError(f"-n {args.n}: sampled completions belong to the zero-shot protocol; add it "
                        f"(--protocol zero-shot,{args.protocol}) or drop -n")
    targets = [resolve(name) for name in names]
    config, start = target_config(targets, args.config, overrides)
    if config.data.episode:
        raise UserError(f"data.episode={config.data.episode}: eval scores single completions; a run with "
                        "episodes evaluates greedy episodes itself (eval_pass_rate in metrics.jsonl)")
    new_tokens = args.max_new_tokens or config.eval.max_new_tokens or config.generation.max_new_tokens
    out = Path(args.out) if args.out else Path("runs") / time.strftime("eval-%Y%m%d-%H%M%S")
    own_run_dir(out, "--out")  # one writer: two evaluations (or a run) in one folder would mix their rows
    try:
        return write_evaluation(args, config, start, targets, new_tokens, out)
    finally:
        release_run_dir(out)


def write_evaluation(args: argparse.Namespace, config: Config, start: Config, targets: list[Target],
                     new_tokens: int, out: Path) -> int:
    """Evaluate every target into OUT's files, then print the table and the figures' line."""
    columns = []
    # The rows go to a .partial file renamed over eval.jsonl at the end: a killed evaluation leaves the
    # last complete pair (eval.jsonl, figures.json) as it was, never a truncated one beside stale figures.
    # Each finished prompt's completions go to the journal too: the same command continues from them.
    partial = out / "eval.jsonl.partial"
    journal = Journal(out)
    try:
        partial.unlink(missing_ok=True)  # a link planted in its place goes, its target untouched
        with partial.open("x", encoding="utf-8") as records:
            for target in targets:
                columns.append(evaluate_target(target, config, start, args, new_tokens, records, journal))
    except BaseException as e:
        journal.close(complete=False)
        if not isinstance(e, UserError) and journal.path.stat().st_size:  # a user error would come again
            print(one_line(f"finished prompts are kept in {journal.path}: the same command with --out {out} "
                           "continues from them"), file=sys.stderr, flush=True)
        raise
    figures = {"task": config.data.task, "protocols": args.protocols, "n": args.n,
               "temperature": args.temperature if args.n else None, "ks": args.ks,
               "max_new_tokens": new_tokens if "zero-shot" in args.protocols else None,
               "targets": columns}
    line = json_line(figures)
    written = False
    try:
        (out / "figures.json").unlink(missing_ok=True)  # never the last run's figures beside these rows
        os.replace(partial, out / "eval.jsonl")
        atomic_write_text(out / "figures.json", line + "\n")
        written = True
    finally:
        journal.close(complete=written)
    print(table(columns, args.n, sections(args, config, new_tokens, columns)))
    for column in columns:
        if column.get("truncated_greedy", 0) >= CUT_OFF_WARNING:
            print(one_line(f"warning: {column['target']}: {column['truncated_greedy']:.0%} of the greedy completions "
                           f"were cut off at {new_tokens} new tokens; raise --max-new-tokens (or eval.max_new_tokens) "
                           "to score whole answers"))
        if column.get("reward_failures"):
            print(failures_line(column["target"], column["reward_failures"]))
    print(f"completions: {out / 'eval.jsonl'}; figures: {out / 'figures.json'}")
    print(line)
    return 0


def evaluate_target(target: Target, config: Config, start: Config, args: argparse.Namespace, new_tokens: int,
                    records: Any, journal: Journal) -> dict[str, Any]:
    """Generate, score and summarise one target by each protocol; its completions are appended to
    `records` (`start`: the config without overrides, for the `tiny` target's warm-start), each
    finished prompt's to `journal` as it finishes."""
    source = model_source(target, start)
    m = config.model
    device = resolve_device(config.rollout.gen_device, "gen")
    tokenizer = load_tokenizer(source, m.trust_remote_code)
    model = load_model(source, resolve_dtype(m.dtype, device), device, m.trust_remote_code, allow_pickle=m.allow_pickle)
    eos = eos_token_ids(model, tokenizer)
    figures: dict[str, Any] = {"target": target.label, "model": source}

    def resumable(phase: str, ids: list[list[int]], size: int, params: SamplingParams) -> dict[str, Any]:
        """generate()'s `kept` and `keep` for one phase: what the journal holds of it, and its writer."""
        key = phase_key(target.label, source, weights_stamp(source), m.dtype, str(device), config.generation.backend,
                        phase, size, params, args.seed, prompt_ids=ids)
        label = f"{target.label} {phase}"
        vocab = max(len(tokenizer), model.get_input_embeddings().num_embeddings)
        kept = journal.take(key, len(ids), size, label, vocab, params.max_new_tokens)
        if kept:  # said in the figures: a resumed sampled phase is two seeds' draws, not one
            figures.setdefault("resumed_prompts", {})[phase] = len(kept)
        return {"kept": kept, "keep": journal.keeper(key)}
    if "zero-shot" in args.protocols:
        figures.update(zero_shot(target, config, args, new_tokens, records, model, tokenizer, eos, resumable))
    if "lm-eval" in args.protocols:
        figures.update(lm_eval_figures(target, config, args, records, model, tokenizer, eos, resumable))
    return figures


def zero_shot(target: Target, config: Config, args: argparse.Namespace, new_tokens: int, records: Any, model: Any,
              tokenizer: Any, eos: list[int], resumable: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The run's own held-out prompts and grader: greedy, and with -n K sampled."""
    task, examples, ids = held_out(config, tokenizer)
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    service = held_out_rewards(config.reward, task, decode)  # the in-run evaluation's scoring, too
    phases = [("greedy", 1, SamplingParams(greedy=True, max_new_tokens=new_tokens))]
    if args.n:
        phases.append((f"n={args.n}", args.n, SamplingParams(args.temperature, args.top_p, new_tokens)))
    results, failures = {}, {}
    for phase, size, params in phases:
        progress = Progress(f"{target.label} {phase}", len(examples))
        journal = resumable(phase, ids, size, params)
        progress(len(journal["kept"]))
        completions = generate(model, eos, ids, examples, size, params, args.seed, progress, **journal)
        progress.close()
        results[phase], failures[phase] = score(service, completions, examples)
    service.close()
    read = answer_reader(task)
    verdicts = {phase: [verdicts_of(group, args.pass_threshold, read) for group in scored]
                for phase, scored in results.items()}
    append_jsonl(records, [row for phase, scored in results.items()
                           for row in rows_of(target.label, examples, scored, verdicts[phase], phase == "greedy")])
    figures: dict[str, Any] = {"prompts": len(examples), "reward_failures": sum(failures.values())}
    figures.update(completion_figures(verdicts["greedy"], "_greedy"))
    if args.n:
        figures.update(completion_figures(verdicts[f"n={args.n}"]))
        figures.update(sampled_figures(verdicts[f"n={args.n}"], args.ks))
    return figures


def lm_eval_figures(target: Target, config: Config, args: argparse.Namespace, records: Any, model: Any,
                    tokenizer: Any, eos: list[int], resumable: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """GSM8K as lm-evaluation-harness scores it (evaluation/lm_eval.py): strict and flexible exact match."""
    examples, prompts = lm_eval_set(config)
    encoder = PromptEncoder(tokenizer)
    ids = [encoder.encode(text) for text in prompts]
    stop = StopStrings(lm_eval.STOP, lambda t: tokenizer.decode(t, skip_special_tokens=False))
    progress = Progress(f"{target.label} lm-eval", len(examples))
    params = SamplingParams(greedy=True, max_new_tokens=lm_eval.MAX_NEW_TOKENS)
    journal = resumable("lm-eval", ids, 1, params)
    progress(len(journal["kept"]))
    completions = generate(model, eos, ids, examples, 1, params, args.seed, progress, stop=stop, **journal)
    progress.close()
    rows, strict, flexible, lengths, cut = [], [], [], [], []
    for example, (completion,) in zip(examples, completions):
        text = lm_eval.cut_at_stop(tokenizer.decode(completion.tokens, skip_special_tokens=True))
        answers = lm_eval.strict_answer(text), lm_eval.flexible_answer(text)
        passed = [lm_eval.matches(a, example.answer) for a in answers]
        strict.append(float(passed[0]))
        flexible.append(float(passed[1]))
        lengths.append(float(len(completion.tokens)))
        cut.append(float(completion.finish_reason == "length"))
        rows.append({"target": target.label, "protocol": "lm-eval", "prompt_id": example.uid, "greedy": True,
                     "sample": 0, "text": text, "strict": answers[0], "flexible": answers[1],
                     "passed_strict": passed[0], "passed_flexible": passed[1], "reference": example.answer,
                     "length": len(completion.tokens), "truncated": completion.finish_reason == "length"})
    append_jsonl(records, rows)
    figures: dict[str, Any] = {"lm-eval_prompts": len(examples)}
    for name, values in (("strict", strict), ("flexible", flexible), ("length_mean", lengths), ("truncated", cut)):
        figures[f"lm-eval_{name}"], figures[f"lm-eval_{name}_se"] = mean_se(values)
    return figures


def lm_eval_set(config: Config) -> tuple[list, list[str]]:
    """The held-out GSM8K examples and their 5-shot prompts, the shots the first train rows."""
    d = config.data
    if d.task != "gsm8k":
        raise UserError(f"--protocol lm-eval scores GSM8K (data.task=gsm8k), not data.task={d.task}")
    if d.path is None and d.eval_path is not None:
        raise UserError("--protocol lm-eval takes its 5 shots from GSM8K's train rows: set data.path to the "
                        "train file (data.eval_path holds the test rows)")
    data = build_data(config, log=lambda _: None)
    task = getattr(data.task, "task", data.task)  # reward functions wrap the task
    if len(data.train) < lm_eval.SHOTS or not data.held_out:
        raise UserError(f"--protocol lm-eval needs {lm_eval.SHOTS} train rows and a held-out row; "
                        f"data.path gave {len(data.train)} and {len(data.held_out)}")
    question = lambda e: str(e.row[task.question_field]).strip()  # noqa: E731
    shots = [(question(e), e.answer) for e in data.train[:lm_eval.SHOTS]]
    return data.held_out, [lm_eval.prompt(shots, question(e)) for e in data.held_out]


def parse_protocols(value: str) -> list[str]:
    names = [p.strip() for p in value.split(",") if p.strip()]
    unknown = [p for p in names if p not in PROTOCOLS]
    if unknown or not names:
        raise UserError(f"--protocol {value}: expected one or more of {', '.join(PROTOCOLS)}, comma-separated")
    return list(dict.fromkeys(names))


def parse_ks(value: str | None, n: int) -> list[int]:
    """The k of pass@k and maj@k: each 1 <= k <= n (k samples cannot be drawn from fewer)."""
    if value is None:
        return ks_up_to(n)
    try:
        ks = sorted({int(k) for k in value.split(",")})
    except ValueError:
        raise UserError(f"--k {value}: expected whole numbers, comma-separated (e.g. --k 1,4,8)") from None
    if not n:
        raise UserError(f"--k {value}: pass@k and maj@k need sampled completions; add -n {max(ks)}")
    if ks[0] < 1 or ks[-1] > n:
        raise UserError(f"--k {value}: each k must be between 1 and -n {n} (pass@{ks[-1]} needs at least "
                        f"{ks[-1]} samples a prompt)")
    return ks


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
        print(one_line(f"warning: prompt check (row {examples[0].uid}): {problem}"), file=sys.stderr, flush=True)
    return data.task, examples, [ids[e.uid] for e in examples]


def verdicts_of(group: list[Scored], threshold: float, read: Any) -> PromptVerdicts:
    return PromptVerdicts([s.reward for s in group], [s.reward >= threshold for s in group],
                          [s.length for s in group], [s.truncated for s in group],
                          [read(s.text) for s in group] if read else [])


def rows_of(label: str, examples: list, scored: list[list[Scored]], verdicts: list[PromptVerdicts],
            greedy: bool) -> list[dict[str, Any]]:
    """eval.jsonl: one row per completion."""
    return [{"target": label, "protocol": "zero-shot", "prompt_id": ex.uid, "greedy": greedy, "sample": i,
             "text": s.text, "reward": s.reward, "passed": v.passed[i], "answer": v.answers[i] if v.answers else None,
             "reference": ex.answer, "prompt": ex.prompt, "length": s.length, "truncated": s.truncated}
            for ex, group, v in zip(examples, scored, verdicts) for i, s in enumerate(group)]
