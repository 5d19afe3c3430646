"""`bench reward`: completions/s of the GSM8K reward (one process, sharded over the reward worker
pool, and through the reward service), and agreement with a careful grader on the written grading
cases for ours, math-verify alone and the strict/flexible regex graders other RL stacks ship.

Completions are built from GSM8K gold solutions (the shared data file or --data; a synthetic
stand-in when neither exists): the question restated, the solution's lines as numbered steps with
the calculator annotations `<<...>>` removed, and the `#### N` line replaced by one of the closing
styles instruction-tuned models write (boxed, "The answer is", "**Final Answer:**", `#### N`, a
closing sentence), with the right answer or a wrong one (N + 1) in turns. Agreement is measured on
the written cases and on real model completions labelled by hand, read from `--cases DIR` (default:
the repository's tests/data/grading; an installed wheel has none and skips agreement, `bench/cases.py`);
`--from RUN` grades a run's own completions instead (`bench/run_completions.py`).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

from ...errors import UserError

DEFAULT_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "gsm8k" / "train.jsonl"
STYLES = ("The answer is $\\boxed{{{n}}}$.", "Therefore, the final answer is $\\boxed{{{n}}}$.", "#### {n}",
          "The answer is {n}.", "**Final Answer:** ${n}", "So the total is {n} dollars.", "\\[\n\\boxed{{{n}}}\n\\]",
          "Final Answer: The final answer is ${n}$. I hope it is correct.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None, help=f"GSM8K JSONL (question, answer) (default: {DEFAULT_DATA} if present)")
    p.add_argument("--completions", type=int, default=4000, help="completions to grade per timing (default 4000)")
    p.add_argument("--workers", type=int, default=2, help="reward worker processes (default 2)")
    p.add_argument("--chunk", type=int, default=250, help="completions per worker job when sharding (default 250)")
    p.add_argument("--group-size", type=int, default=8, help="completions per reward-service call (default 8)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds after one warm-up round; median (default 5)")
    p.add_argument("--agreement", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure agreement on the grading cases and the labelled real completions (default on)")
    p.add_argument("--cases", default=None, metavar="DIR",
                   help="the folder of grading cases and labelled completions (default: the repository's "
                        "tests/data/grading, when this package sits in a clone)")
    p.add_argument("--from", dest="from_run", default=None, metavar="RUN",
                   help="grade a run's completions (RUN/samples.jsonl, or a JSONL file) with every grader and print "
                        "where they disagree, instead of timing")
    p.add_argument("--completion-field", default="completion", help="with --from: the row field of the completion text")
    p.add_argument("--answer-field", default="answer", help="with --from: the row field of the gold answer")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ...grading.verify import SYMBOLIC_PRELOAD
    from ...isolation.pool import WorkerPool
    from .run_completions import run_from

    if args.from_run:
        return run_from(args.from_run, args.completion_field, args.answer_field)
    cases = _cases_or_note(args)
    golds, texts = completions(_rows(args.data), args.completions)
    pool = WorkerPool(args.workers, preload=("aioareal.grading.verify", SYMBOLIC_PRELOAD))
    try:
        if not pool.wait_ready(120):
            raise UserError("reward worker processes did not start (see the errors above)")
        timings, cpu = _alternate({
            "single": lambda: _single(golds, texts),
            "pool": lambda: _sharded(pool, golds, texts, args.chunk),
            "service": lambda: _service(pool, golds, texts, args.group_size, args.workers)}, args.repeats)
    finally:
        pool.close()
    n = len(texts)
    result: dict[str, Any] = {"bench": "reward", "completions": n, "mean_chars": round(sum(map(len, texts)) / n),
                              "workers": args.workers, "cores": _cores(),
                              **{f"{k}_cps": round(n / s, 1) for k, s in timings.items()},
                              "single_cpu_cps": round(n / cpu, 1),
                              "pool_vs_single": round(timings["single"] / timings["pool"], 2)}
    if cases is not None:
        result.update(agreement(cases))
    return result


def _cases_or_note(args: argparse.Namespace) -> Path | None:
    """The folder agreement is measured on (checked before any timing), or None with a one-line note."""
    from .cases import cases_dir

    if not args.agreement:
        return None
    folder = cases_dir(args.cases)
    if folder is None:
        print("bench reward: no grading cases beside this installed package (a clone has them in "
              "tests/data/grading; --cases DIR reads them): agreement figures skipped")
    return folder


def completions(rows: list[dict[str, str]], n: int) -> tuple[list[str], list[str]]:
    """(gold solutions, completions): GSM8K-like completions, right and wrong in turns."""
    golds, texts = [], []
    for i in range(n):
        row = rows[i % len(rows)]
        body, _, final = row["answer"].rpartition("####")
        steps = [re.sub(r"<<[^>]*>>", "", line).strip() for line in body.strip().splitlines() if line.strip()]
        answer = final.strip().replace(",", "")
        shown = answer if i % 2 == 0 else _off_by_one(answer)
        lines = [f"Let's solve this step by step. We know that: {row['question']}", ""]
        lines += [f"**Step {k}:** {step}" for k, step in enumerate(steps, 1)]
        lines += ["", STYLES[i % len(STYLES)].format(n=shown)]
        golds.append(row["answer"])
        texts.append("\n".join(lines))
    return golds, texts


def agreement(folder: Path) -> dict[str, Any]:
    """Fraction of the grading cases in `folder` each grader scores as the careful grader did, and the
    same on real completions labelled by hand (`real_*`)."""
    from ...grading.verify import grade_now
    from .baselines import BASELINES
    from .cases import load_cases, load_real
    from .run_completions import scores as graded
    from .run_completions import summary

    cases = load_cases(folder)
    expected = [c.score for c in cases]
    scores = {"ours": grade_now([c.gold for c in cases], [c.completion for c in cases], 10.0)}
    scores.update({name: [fn(c.gold, c.completion) for c in cases] for name, fn in BASELINES.items()})
    out: dict[str, Any] = {"cases": len(cases)}
    for name, got in scores.items():
        out[f"agree_{name}"] = round(sum(g == e for g, e in zip(got, expected)) / len(cases), 3)
        out[f"false_pass_{name}"] = sum(g == 1.0 and e == 0.0 for g, e in zip(got, expected))
        out[f"false_fail_{name}"] = sum(g == 0.0 and e == 1.0 for g, e in zip(got, expected))
    real = load_real(folder)
    return {**out, **summary(real, graded(real), prefix="real_")}


def _single(golds: list[str], texts: list[str]) -> None:
    from ...grading.verify import grade_now

    grade_now(golds, texts, 10.0)


def _sharded(pool: Any, golds: list[str], texts: list[str], chunk: int) -> None:
    """Chunks graded in worker processes; the rare symbolic checks they hand back run in the pool too."""
    from ...isolation.pool import Deferred

    futures = [pool.submit("aioareal.grading.verify:grade_batch", (golds[i:i + chunk], texts[i:i + chunk]), 120.0)
               for i in range(0, len(texts), chunk)]
    results = [x for f in futures for x in (f.result().value or [])]
    checks = [pool.submit(d.fn, d.args, 10.0) for d in results if isinstance(d, Deferred)]
    for f in checks:
        f.result()


def _service(pool: Any, golds: list[str], texts: list[str], group: int, workers: int) -> None:
    """Through `RewardService.score`, one call per group of completions, all groups submitted at once."""
    from ...grading.verify import SYMBOLIC_PRELOAD, grade
    from ...group import Example
    from ...rewards.service import GradedScorer, RewardService

    scorer = GradedScorer(lambda text, example: grade(example.answer, text), (SYMBOLIC_PRELOAD,))
    service = RewardService(scorer, decode=lambda ids: texts[ids[0]], workers=workers, timeout_s=30.0, pool=pool)
    examples = [Example(str(i), "", g) for i, g in enumerate(golds)]

    async def go() -> None:
        await asyncio.gather(*(service.score([[j] for j in range(i, min(i + group, len(texts)))],
                                             examples[i:i + group]) for i in range(0, len(texts), group)))
    asyncio.run(go())
    if service.stats.failures:
        raise UserError(f"{service.stats.failures} completions failed to grade in the benchmark")


def _alternate(runs: dict[str, Callable[[], None]], repeats: int) -> tuple[dict[str, float], float]:
    """Median wall seconds of each contender, run in turns (a, b, c, a, b, c, ...) after one warm-up
    round so that a busy machine's drifts hit all alike; and the single-process run's median CPU
    seconds (what one uncontended core would take)."""
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: list[float] = []
    for round_ in range(1 + max(1, repeats)):
        for name, fn in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            if round_:
                wall[name].append(time.perf_counter() - start)
                if name == "single":
                    cpu.append(time.process_time() - start_cpu)
    return {name: median(times) for name, times in wall.items()}, median(cpu)


def _rows(path: str | None) -> list[dict[str, str]]:
    file = Path(path) if path else DEFAULT_DATA
    if path and not file.is_file():
        raise UserError(f"--data {path}: no such file")
    if not file.is_file():  # a stand-in with GSM8K's shape
        return [{"question": f"Tom has {a} apples and buys {b} bags of {c}. How many apples does he have?",
                 "answer": f"The bags hold {b} * {c} = <<{b}*{c}={b * c}>>{b * c} apples.\n"
                           f"He has {a} + {b * c} = <<{a}+{b * c}={a + b * c}>>{a + b * c} apples.\n#### {a + b * c}"}
                for a in range(3, 40) for b, c in ((2, 6), (3, 4), (5, 12))]
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]


def _off_by_one(answer: str) -> str:
    try:
        return str(int(answer) + 1)
    except ValueError:
        return answer + "1"


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
