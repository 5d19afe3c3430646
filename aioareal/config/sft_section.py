"""`sft`: supervised fine-tuning on demonstrations, the stage before RL (`python -m aioareal sft`; one
section of the typed config, schema.py)."""
from __future__ import annotations

from dataclasses import dataclass

from .fields import check, doc


@dataclass
class SFTConfig:
    path: str | None = doc("demonstrations file (JSONL/JSON/CSV/Parquet) with prompt and completion columns; "
                           "none = the task's own: GSM8K's train solutions ending in the boxed answer", None)
    prompt_field: str = doc("the demonstrations' prompt column", "prompt")
    completion_field: str = doc("the demonstrations' completion column", "completion")
    steps: int = doc("optimizer steps of supervised fine-tuning", 200)
    batch_size: int = doc("demonstrations per optimizer step", 16)
    micro_batch: int = doc("demonstrations per forward/backward (gradients accumulate over the batch)", 4)
    lr: float = doc("peak learning rate (linear warm-up, then linear decay to 10% at sft.steps)", 1e-5)
    warmup_steps: int = doc("steps of linear learning-rate warm-up", 10)
    max_tokens: int = doc("longest demonstration trained, prompt and completion (longer ones are left out and "
                          "counted)", 768)
    eval_size: int = doc("demonstrations held out for the held-out loss (carved off a seeded shuffle)", 64)
    eval_every: int = doc("held-out loss every N steps (0 = at the start and the end only)", 25)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "micro_batch", "max_tokens"):
            check(getattr(self, name) >= 1, f"sft.{name}", f"must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_size", "eval_every"):
            check(getattr(self, name) >= 0, f"sft.{name}", f"must be >= 0, got {getattr(self, name)}")
        check(self.lr > 0, "sft.lr", f"must be > 0, got {self.lr}")
        check(self.micro_batch <= self.batch_size, "sft.micro_batch",
              f"must be at most sft.batch_size ({self.batch_size}), got {self.micro_batch}")
