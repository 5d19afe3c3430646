"""`python -m aioareal samples RUN [--eval] [--step N | --last] [--best|--worst] [-n K]`: what the model wrote.

Reads a run's samples.jsonl (or with --eval its eval_samples.jsonl: the held-out completions of each
evaluation) as data (one JSON object a line, never evaluated) and prints the chosen samples: step,
reward, advantage, staleness, prompt id, then the prompt (where the row kept it) and the
completion's text. Without --best/--worst it prints the latest K in file order; --best and --worst
sort by reward (ties: the later step first, then file order). --last keeps the last step's rows.
Text is printed with control characters escaped: a model can write terminal escape sequences.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from ..errors import DataError, UserError, guarded, reading, terminal_safe
from ..io import jsonl_lines, parse_row
from ..monitor.metrics import EVAL_SAMPLES_FILE, SAMPLES_FILE

NO_TEXT = "(no text: run.sample_text_chars=0, or the scorer never decoded it)"
NUMBERS = ("step", "reward")  # fields every row must hold, as numbers, to be selected and sorted


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m aioareal samples",
                                description="Print what the model wrote: completions from a run's samples.jsonl, "
                                            "the latest K in file order unless --best or --worst sorts them.")
    p.add_argument("run", metavar="RUN", help="a run directory (holds samples.jsonl)")
    p.add_argument("--eval", action="store_true", help=f"the held-out evaluations' completions ({EVAL_SAMPLES_FILE})")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="only the samples trained (or evaluated) at this step")
    which.add_argument("--last", action="store_true", help="only the last step's samples")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--best", action="store_true", help="highest reward first (ties: later step first)")
    order.add_argument("--worst", action="store_true", help="lowest reward first (ties: later step first)")
    p.add_argument("-n", type=int, default=10, metavar="K", help="how many to print (default 10; 0 = all)")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    return p


def read_samples(run_dir: str | Path, name: str = SAMPLES_FILE) -> list[dict[str, Any]]:
    """The rows of `run_dir`/`name` (samples.jsonl or eval_samples.jsonl); a missing directory or
    file, or a malformed line, is an error naming it (file and line number)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    path = run_dir / name
    if not path.is_file():
        when = "at each evaluation" if name == EVAL_SAMPLES_FILE else "from its first training step on"
        raise UserError(f"{run_dir}: no {name} (a run writes it {when})")
    with reading(path, f"{name} rows"):
        return [_row(line, path, lineno) for lineno, line in jsonl_lines(path)]


def _row(line: str | None, path: Path, lineno: int) -> dict[str, Any]:
    try:
        row = parse_row(line)
    except ValueError as e:
        raise DataError(f"{path}:{lineno}: malformed JSON line ({e})") from None
    for key in NUMBERS:
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DataError(f"{path}:{lineno}: '{key}' must be a number, got {value!r}")
    return row


def select(rows: list[dict[str, Any]], step: int | None = None, order: str | None = None,
           n: int = 10) -> list[dict[str, Any]]:
    """The rows to print: those of `step` (all if None), sorted by reward for order "best" or
    "worst" (ties: the later step first, the policy as trained furthest, then file order) and the
    first `n` of them, or the last `n` in file order without an order; n = 0 keeps all."""
    chosen = [r for r in rows if step is None or r["step"] == step]
    if order is not None:
        sign = -1 if order == "best" else 1
        chosen = sorted(chosen, key=lambda r: (sign * r["reward"], -r["step"]))  # stable: file order last
        return chosen[:n] if n else chosen
    return chosen[-n:] if n else chosen


def printable(text: str) -> str:
    """Control characters escaped (\\x1b, ...), newlines and tabs kept (errors.terminal_safe)."""
    return terminal_safe(text)


def _num(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def format_sample(row: dict[str, Any]) -> str:
    """A header line with the numbers, then the prompt (where kept) and the text, indented."""
    if "greedy" in row:  # a held-out completion (eval_samples.jsonl)
        kind = "greedy" if row["greedy"] else f"sample {row.get('sample', '-')}"
        head = (f"step {row['step']} · eval {kind} · reward {_num(row['reward'], '.3f')}"
                f" · length {row.get('length', '-')}{' (cut off)' if row.get('truncated') else ''}"
                f" · prompt {row.get('prompt_id') or '-'}")
    else:
        head = (f"step {row['step']} · reward {_num(row['reward'], '.3f')} · advantage "
                f"{_num(row.get('advantage'), '+.3f')} · staleness {row.get('staleness', '-')} · prompt "
                f"{row.get('prompt_id') or '-'}")
    head = terminal_safe(head, keep_newlines=False)  # every field is data from the file
    lines = [head]
    if row.get("prompt"):
        lines.append("  prompt: " + printable(str(row["prompt"])).replace("\n", "\n          "))
    text = row.get("text")
    body = NO_TEXT if text is None else printable(str(text))
    lines += ["  " + line for line in body.split("\n")]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)

    def go() -> int:
        if args.n < 0:
            raise UserError(f"-n must be >= 0 (0 = all), got {args.n}")
        order = "best" if args.best else "worst" if args.worst else None
        name = EVAL_SAMPLES_FILE if args.eval else SAMPLES_FILE
        rows = read_samples(args.run, name)
        if not rows:
            raise UserError(f"{args.run}: {name} holds no samples yet")
        step = max(r["step"] for r in rows) if args.last else args.step
        chosen = select(rows, step, order, args.n)
        if not chosen:
            steps = sorted({r["step"] for r in rows})
            shown = ", ".join(map(str, steps)) if len(steps) <= 12 else f"{steps[0]} to {steps[-1]}"
            raise UserError(f"{args.run}: no samples {'evaluated' if args.eval else 'trained'} at step {args.step} "
                            f"({'evaluation ' if args.eval else ''}steps {shown})")
        print("\n\n".join(format_sample(r) for r in chosen))
        return 0
    return guarded(args.debug, go)
