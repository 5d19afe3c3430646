"""What the engine is asked to generate and what it hands back."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GroupRequest:
    """G samples of one prompt: the unit of admission, prefill sharing and advantage normalisation."""

    group_id: int
    prompt_ids: list[int]
    n: int
    payload: Any = None  # the orchestrator's own record (prompt, admission stamps); never read here
    # Per-sample length caps with end-of-sequence tokens ignored: benchmarks on random weights use
    # these to impose a realistic (long-tailed) length distribution.
    lengths: list[int] | None = None


@dataclass(slots=True)
class Completion:
    """One sampled completion, with the behaviour logprob and policy version of every token."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = ""  # "stop" (an EOS token) or "length" (max_new_tokens or context)


@dataclass
class GroupResult:
    request: GroupRequest
    completions: list[Completion]


@dataclass(slots=True)
class Running:
    """A sequence occupying a KV-cache slot. The cache holds prompt + tokens[:-1]; tokens[-1] is
    the next input, to be written at position prompt_len + len(tokens) - 1. Right after admission
    the first token is sampled but not yet recorded on the host: it goes to position prompt_len."""

    group: "GroupState"
    index: int
    slot: int
    completion: Completion
    prompt_len: int = 0
    limit: int = 0  # tokens at which the sequence ends whatever it samples
    stop_on_eos: bool = True  # False under forced lengths


@dataclass
class GroupState:
    request: GroupRequest
    completions: list[Completion]
    unfinished: int
