"""`train`: how the trainer computes a step (one section of the typed config, schema.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .fields import check, doc


@dataclass
class TrainConfig:
    steps: int = doc("training steps (policy versions to produce)", 400)
    micro_batch_tokens: int = doc("token budget of one packed micro-batch (padding included)", 8192)
    logprob_chunk: int = doc("tokens per chunk when computing log-probs over the vocabulary", 2048)
    compile: bool = doc("compile each decoder layer with torch.compile (dynamic shapes; for a GPU: on a CPU "
                        "compiling takes minutes)", False)
    varlen: bool | Literal["auto"] = doc("where prompts are not shared, each micro-batch as one row attended per "
                                         "sequence (no padding FLOPs); auto = with CUDA's varlen kernel", "auto")
    prefix_tree: bool | Literal["auto"] = doc("compute each distinct prefix of a micro-batch once, its sequences as a "
                                              "trie (identical completions, shared prompts); auto = on the CPU, for "
                                              "micro-batches where it computes at most 0.8x the positions", "auto")
    precision: Literal["autocast", "masters"] = doc(
        "how the trainer computes in a bf16 model.train_dtype: autocast = fp32 weights, each op cast to bf16; "
        "masters = a bf16 working copy of the model runs forward and backward, the optimizer updates fp32 master "
        "weights kept apart and copies them back (half the activation memory, no casts; one process, full "
        "fine-tuning)", "autocast")
    optimizer_moments: Literal["float32", "bfloat16"] = doc(
        "dtype of AdamW's two moments: bfloat16 halves the optimizer state, stochastically rounded (one process; "
        "docs/log/2026-11-memory.md)", "float32")
    lean_activations: bool = doc(
        "RMSNorms and SwiGLU MLPs keep less for the backward (about 30% of the activations; the same forward); a "
        "module whose own forward differs keeps it (trainer/lean_layers.py)", True)
    skip_zero_advantage: bool = doc(
        "leave samples whose advantage is exactly 0 out of the forward and backward: their gradient is zero, and "
        "they still count in the loss's normalisers, so the update is the same (entropy and the behaviour "
        "statistics then cover the computed samples; off with algo.kl_coef > 0, whose penalty has a gradient)", True)
    max_logprob_gap: float = doc("stop the run when a step's logprob_gap_max (generator vs trainer, nats) exceeds "
                                 "it; 0 = 0.05 when both compute in fp32, else 2.0 (none with recompute_kv=false)", 0.0)

    def __post_init__(self) -> None:
        check(self.steps >= 0, "train.steps", f"must be >= 0, got {self.steps}")
        check(self.micro_batch_tokens > 0, "train.micro_batch_tokens", f"must be > 0, got {self.micro_batch_tokens}")
        check(self.logprob_chunk > 0, "train.logprob_chunk", f"must be > 0, got {self.logprob_chunk}")
        check(self.max_logprob_gap >= 0, "train.max_logprob_gap", f"must be >= 0, got {self.max_logprob_gap}")
