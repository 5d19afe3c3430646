"""Completion-length distributions shared by `bench e2e` (forced lengths on random weights) and the
simulator: GSM8K-like lognormal, uniform, fixed, or the lengths of a real run's samples.jsonl.

The bench and the simulator draw from the same function with the same seed, one group at a time in
admission order, so a simulation of a bench setting sees exactly the lengths the bench generated.
"""
from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

from ...errors import UserError

Draw = Callable[[random.Random], int]
KINDS = ("gsm8k", "uniform", "fixed")


def gsm8k_like_length(rng: random.Random, mean: float = 200.0, cap: int = 1024) -> int:
    """Long-tailed completion lengths: lognormal with GSM8K-like spread, capped."""
    sigma = 0.6
    return max(1, min(cap, int(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma))))


def length_sampler(kind: str, mean: float, cap: int) -> Draw:
    """`kind`: gsm8k (lognormal, long tail), uniform [1, 2*mean), fixed (= mean); capped at `cap`."""
    if kind == "gsm8k":
        return lambda rng: gsm8k_like_length(rng, mean, cap)
    if kind == "uniform":
        return lambda rng: max(1, min(cap, rng.randrange(1, max(2, int(2 * mean)))))
    if kind == "fixed":
        return lambda rng: max(1, min(cap, int(mean)))
    raise UserError(f"--lengths {kind}: expected one of {', '.join(KINDS)} or a run's samples.jsonl")


def lengths_of_run(path: str | Path) -> list[int]:
    """The `length` column of a run's samples.jsonl (a run directory works too)."""
    p = Path(path)
    if p.is_dir():
        p = p / "samples.jsonl"
    if not p.is_file():
        raise UserError(f"--lengths {path}: no such samples.jsonl (give a run directory or its samples.jsonl)")
    lengths = []
    with p.open() as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                lengths.append(int(json.loads(line)["length"]))
            except (ValueError, KeyError, TypeError) as e:
                raise UserError(f"{p}:{number}: expected a samples.jsonl row with an integer 'length' ({e})") from e
    if not lengths:
        raise UserError(f"{p}: no samples (the run trained no step yet?)")
    return lengths


def empirical_sampler(lengths: list[int], cap: int) -> Draw:
    """Draw with replacement from observed lengths (capped at `cap`, as the engine would)."""
    return lambda rng: max(1, min(cap, lengths[rng.randrange(len(lengths))]))


def sampler(spec: str, mean: float, cap: int) -> tuple[Draw, str]:
    """A named distribution or a samples.jsonl; returns the draw and a label for reports."""
    if spec in KINDS:
        return length_sampler(spec, mean, cap), f"{spec} mean {mean:g} cap {cap}"
    lengths = lengths_of_run(spec)
    return empirical_sampler(lengths, cap), f"{len(lengths)} lengths of {spec} (mean {sum(lengths) / len(lengths):.0f})"
