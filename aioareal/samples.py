"""The records that flow from generator to trainer: samples and their groups."""
from __future__ import annotations

from dataclasses import dataclass, field

from .generation.sequence import Completion
from .tasks.base import Example


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
        return min(self.completion.versions)

    @property
    def version_max(self) -> int:
        return max(self.completion.versions)

    def staleness(self, trained_version: int) -> int:
        """DESIGN: trained version minus the oldest version among the sample's tokens."""
        return trained_version - self.version_min


@dataclass
class Group:
    """The G samples of one prompt: the unit of admission and of advantage normalisation."""

    group_id: int  # admission order: batches are formed oldest-first by this id
    example: Example
    prompt_ids: list[int]
    admitted_version: int
    admitted_at: float  # seconds since run start
    cursor: int = -1  # position of its prompt in the training source (resume restarts from the oldest)
    samples: list[Sample] = field(default_factory=list)
    finished_at: float = 0.0
    reward_failures: int = 0  # verifier calls that raised, hung or returned garbage (scored 0)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    def staleness(self, trained_version: int) -> int:
        return max(s.staleness(trained_version) for s in self.samples)
