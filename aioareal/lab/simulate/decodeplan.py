"""The simulated generator's decode steps between two moments the orchestrator must see, as
segments of constant shape, and what they cost: the decode model summed in closed form.

A segment is k decode steps over n slots whose attention span starts at `span` and grows by one
per step (every running sequence gains a token); it ends where a sequence ends, since that may
change the highest live slot (n) or the longest context (span).
"""
from __future__ import annotations

from dataclasses import dataclass

from .cost_profile import DecodeCost


@dataclass(slots=True)
class Segment:
    steps: int
    n: int
    span: int


def segment_seconds(d: DecodeCost, seg: Segment, k: int | None = None) -> float:
    """The first k (default all) decode steps of a segment: sum over i < k of a + b*n + c*n*(span+i)."""
    k = seg.steps if k is None else k
    return k * (d.a + d.b * seg.n + d.c * seg.n * seg.span) + d.c * seg.n * k * (k - 1) / 2


def plan_seconds(d: DecodeCost, plan: list[Segment], steps: int | None = None) -> float:
    """The first `steps` (default all) decode steps of a plan."""
    total, left = 0.0, sum(s.steps for s in plan) if steps is None else steps
    for seg in plan:
        k = min(seg.steps, left)
        total += segment_seconds(d, seg, k)
        left -= k
        if left == 0:
            break
    return total


def steps_begun(d: DecodeCost, plan: list[Segment], seconds: float) -> int:
    """Decode steps begun within `seconds` of the plan's start, the one in progress included (at
    least one: an engine step always decodes)."""
    done = 0
    for seg in plan:
        whole = segment_seconds(d, seg)
        if seconds <= whole:
            lo, hi = 1, seg.steps
            while lo < hi:  # the fewest steps whose time reaches `seconds`
                mid = (lo + hi) // 2
                if segment_seconds(d, seg, mid) >= seconds:
                    hi = mid
                else:
                    lo = mid + 1
            return done + lo
        seconds -= whole
        done += seg.steps
    return done
