"""What `eval` shows and writes: progress while it runs (rich on a terminal), the side-by-side table, eval.jsonl's rows
and the figures' JSON line (NaN, an undefined standard error, written as null)."""
from __future__ import annotations

import json
import math
import sys
from typing import Any, TextIO

from ..evaluation.scored_completions import ks_up_to

PLAIN_EVERY = 0.25  # without a terminal: a line at each quarter of a phase


class Progress:
    """Prompts finished of `total`: a rich progress bar on a terminal, a plain line at each quarter
    otherwise (logs and pipes), nothing for sets too small to wait for."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None, quiet_below: int = 32) -> None:
        self.label, self.total, self.done = label, total, 0
        self.stream = stream or sys.stderr
        self.quiet = total < quiet_below
        self._next = PLAIN_EVERY
        self._bar: Any = None
        if not self.quiet and self.stream.isatty():
            from rich.console import Console
            from rich.progress import Progress as Bar

            self._bar = Bar(*Bar.get_default_columns(), console=Console(file=self.stream), transient=False)
            self._task = self._bar.add_task(label, total=total)
            self._bar.start()

    def __call__(self, finished: int) -> None:
        self.done += finished
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
        elif not self.quiet and self.done >= self._next * self.total:
            print(f"{self.label}: {self.done}/{self.total} prompts", file=self.stream, flush=True)
            while self._next * self.total <= self.done:
                self._next += PLAIN_EVERY

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


Section = tuple[str, list[tuple[str, str]]]  # a title line, then (figure name, row label) rows
LM_EVAL_ROWS = [("lm-eval_strict", "strict-match"), ("lm-eval_flexible", "flexible-extract"),
                ("lm-eval_length_mean", "length, greedy"), ("lm-eval_truncated", "cut off, greedy")]


def metric_rows(n: int, with_answers: bool, ks: list[int] | None = None) -> list[tuple[str, str]]:
    """The zero-shot protocol's (figure name, row label) in the table's order."""
    ks = ks_up_to(n) if ks is None else ks
    rows = [("pass@1_greedy", "pass@1 greedy")]
    if n:
        rows.append(("pass@1", f"pass@1 sampled (n={n})"))
        rows += [(f"pass@{k}", f"pass@{k}") for k in ks if k > 1]
        if with_answers:
            rows += [(f"maj@{k}", f"maj@{k}") for k in ks]
        rows += [("reward_mean", "reward, sampled"), ("length_mean", "length, sampled"),
                 ("truncated", "cut off, sampled")]
    return rows + [("reward_mean_greedy", "reward, greedy"), ("length_mean_greedy", "length, greedy"),
                   ("truncated_greedy", "cut off, greedy")]


def cell(figures: dict[str, Any], name: str) -> str:
    value, se = figures.get(name), figures.get(name + "_se")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    spec = ".1f" if "length" in name else ".3f"
    if se is None or math.isnan(se):
        return format(value, spec)
    return f"{value:{spec}} ± {se:{spec}}"


def sections(args: Any, config: Any, new_tokens: int, columns: list[dict[str, Any]]) -> list[Section]:
    """The table's sections, one per protocol asked for, each titled with how it prompted and decoded."""
    from ..evaluation import lm_eval

    first = columns[0] if columns else {}
    out: list[Section] = []
    for protocol in args.protocols:
        if protocol == "zero-shot":
            sampled = f", {args.n} sampled at T={args.temperature:g} top-p={args.top_p:g}" if args.n else ""
            title = (f"zero-shot: the run's prompts ({prompt_style(config)}) and grader; greedy{sampled}; "
                     f"up to {new_tokens} new tokens; {first.get('prompts', 0)} prompts")
            out.append((title, metric_rows(args.n, any(k.startswith("maj@") for c in columns for k in c), args.ks)))
        else:
            title = (f"lm-eval: GSM8K {lm_eval.SHOTS}-shot (the first train rows), no chat template; greedy, "
                     f"stops at {lm_eval.STOP[0]}; up to {lm_eval.MAX_NEW_TOKENS} new tokens; "
                     f"{first.get('lm-eval_prompts', 0)} prompts")
            out.append((title, LM_EVAL_ROWS))
    return out


def prompt_style(config: Any) -> str:
    d = config.data
    template = {True: "chat template", False: "no chat template", None: "the task's template"}[d.chat_template]
    return template + (", system prompt" if d.system_prompt else "")


def table(columns: list[dict[str, Any]], n: int, parts: list[Section] | None = None) -> str:
    """One row per figure, one column per target (mean ± standard error over prompts), in one section
    per protocol (default: the zero-shot rows alone, untitled)."""
    if parts is None:
        parts = [("", metric_rows(n, any("maj@1" in c for c in columns)))]
    head = ["figure"] + [str(c["target"]) for c in columns]
    bodies = [[[label] + [cell(c, name) for c in columns] for name, label in rows] for _, rows in parts]
    widths = [max(len(r[i]) for r in [head, *(row for body in bodies for row in body)]) for i in range(len(head))]
    line = lambda r: "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))  # noqa: E731
    top = line(head)
    out = [top, "-" * len(top)]
    for (title, _), body in zip(parts, bodies):
        out += ([title] if title else []) + [line(r) for r in body]
    return "\n".join(out)


def json_line(figures: dict[str, Any]) -> str:
    """The figures as one JSON line; NaN (a standard error of one prompt) becomes null."""
    return json.dumps(_nulls(figures), allow_nan=False)


def _nulls(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nulls(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nulls(v) for v in x]
    return x
