"""The one record a group of samples travels in, from admission through the engine and the scorer
to the trainer (docs/architecture.md#terms):

    orchestrator   Group(group_id, prompt_ids, size, example, admitted_version, admitted_at, cursor)
    engine         fills `samples`: one Sample per completion, tokens + behaviour log-probs + versions
    reward service sets each completion's `text` and each sample's `reward` (and the group's `reward_failures`)
    trainer        sets each sample's `advantage`, trains on the group

Evaluation and the benchmarks submit Groups too, with no example or with forced lengths.

Episodes (docs/architecture.md rule 9, episodes/) fill the same record over several turns: a completion's
`tokens` are everything after the prompt in order, the model's turns and the world's answers
(observation tokens) interleaved; `turns` says which span is whose. Observation positions hold
placeholders in `logprobs` (NaN) and `versions` (OBS_VERSION): they were never sampled, and
nothing reads them (the trainer masks them out of every term: `model_mask`). A single completion
has no turns, so it is exactly the record it always was: every token is the model's."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

OBS_VERSION = -1  # the version placeholder of an observation token (never sampled by any policy)
OBS_LOGPROB = math.nan  # its behaviour log-prob placeholder: never read (a NaN would show at once if it were)
MODEL = "assistant"  # the role of the model's own turns; every other role is the world's


@dataclass(frozen=True)
class Example:
    uid: str
    prompt: str  # the user message (chat) or the full prompt text (raw)
    answer: str  # reference the verifier compares against
    row: dict[str, Any] = field(default_factory=dict, compare=False)  # original columns, for reward functions
    # A conversational row (TRL's format): the prompt as {role, content} messages, rendered with the
    # chat template as they are; `prompt` then holds the last user message (for display).
    messages: list[dict[str, str]] | None = field(default=None, compare=False)


@dataclass(slots=True)
class Turn:
    """One turn of an episode: who wrote it, what it says, where its tokens sit in the completion."""

    role: str  # MODEL for the model's tokens; the world's: "tool", "user", ...
    text: str
    start: int  # its tokens are completion.tokens[start:end]
    end: int


@dataclass(slots=True)
class ToolCall:
    """One tool call an episode made, for the metrics (tool_calls, tool_errors, tool_latency_mean)."""

    name: str
    seconds: float
    error: str | None = None  # None: it answered; else what went wrong (timeout, raised, returned garbage)


@dataclass(slots=True)
class Completion:
    """One sampled completion, with the behaviour logprob and policy version of every token."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str = ""  # "stop" (an EOS token) or "length" (max_new_tokens or context)
    # The tokens decoded, as the reward service scored them (set by its `score_group`, which decodes
    # them anyway, off the event loop); None where no scorer decoded them (or its call timed out first).
    # An episode's text is the whole interaction, its turns' texts in order.
    text: str | None = None
    turns: list[Turn] = field(default_factory=list)  # an episode's turns; empty for a single completion
    tool_calls: list[ToolCall] = field(default_factory=list)  # an episode's tool calls, in order

    def model_mask(self) -> list[bool] | None:
        """Per token: True where the model sampled it, False for observation tokens; None when
        every token is the model's (a single completion, or an episode that observed nothing)."""
        world = [t for t in self.turns if t.role != MODEL and t.end > t.start]
        if not world:
            return None
        mask = [True] * len(self.tokens)
        for t in world:
            mask[t.start:t.end] = [False] * (t.end - t.start)
        return mask

    @property
    def obs_tokens(self) -> int:
        return sum(t.end - t.start for t in self.turns if t.role != MODEL)

    @property
    def model_versions(self) -> list[int]:
        """The versions of the model's tokens (observation placeholders left out)."""
        if not self.turns:
            return self.versions
        return [v for v in self.versions if v != OBS_VERSION]


@dataclass(slots=True)
class Sample:
    """One completion of one prompt, with everything the trainer and the metrics need."""

    prompt_ids: list[int]
    completion: Completion
    reward: float = 0.0
    advantage: float = 0.0

    @property
    def tokens(self) -> list[int]:
        return self.completion.tokens

    @property
    def version_min(self) -> int:
        return min(self.completion.model_versions)

    @property
    def version_max(self) -> int:
        return max(self.completion.model_versions)

    def staleness(self, trained_version: int) -> int:
        """docs/architecture.md#terms: trained version minus the oldest version among the sample's tokens (the model's
        tokens: observations carry no version)."""
        return trained_version - self.version_min


@dataclass
class Group:
    """The G samples of one prompt: the unit of admission, prefill sharing and advantage normalisation."""

    group_id: int  # admission order: batches are formed oldest-first by this id (unique per engine)
    prompt_ids: list[int]
    size: int  # G: how many completions the engine samples
    example: Example | None = None  # the task's row (None for benchmarks on synthetic prompts)
    admitted_version: int = 0
    admitted_at: float = 0.0  # seconds since run start
    cursor: int = -1  # position of its prompt in the training source (resume restarts from the oldest)
    # Per-sample lengths with end-of-sequence tokens ignored: the start-up check samples exactly this
    # many tokens to compare with the model's forward (generation/backends.py), and benchmarks on
    # random weights impose a realistic (long-tailed) length distribution with them.
    forced_lengths: list[int] | None = None
    samples: list[Sample] = field(default_factory=list)  # filled by the engine as it admits the group
    finished_at: float = 0.0
    reward_failures: int = 0  # verifier calls that raised, hung or returned garbage (scored 0)

    def start_samples(self) -> list[Sample]:
        """The engine's start on the group: one empty completion per sample."""
        self.samples = [Sample(self.prompt_ids, Completion()) for _ in range(self.size)]
        return self.samples

    @property
    def completions(self) -> list[Completion]:
        return [s.completion for s in self.samples]

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    def set_rewards(self, rewards: list[float], failures: int = 0) -> None:
        if len(rewards) != len(self.samples):
            raise ValueError(f"group {self.group_id}: {len(rewards)} rewards for {len(self.samples)} samples")
        for sample, reward in zip(self.samples, rewards):
            sample.reward = reward
        self.reward_failures = failures

    def staleness(self, trained_version: int) -> int:
        return max(s.staleness(trained_version) for s in self.samples)
