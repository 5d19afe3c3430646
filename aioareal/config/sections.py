"""The typed config's smaller sections: `algo` (the RL objective and its optimizer), `train` (how the
trainer computes a step), `sft` (supervised fine-tuning, docs/sft.md), `warmup` (the tiny model's
warm-start) and `tools` (what episodes may call), and `doc`, the field with help text that every
section uses. schema.py holds the rest and `Config`, whose `__post_init__` holds the checks that read
several fields; limits.py the valid values of each single field."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .limits import check, check_fields


def doc(text: str, default: object) -> object:
    """A dataclass field with help text (printed by `python -m aioareal config --keys`)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": text})
    return field(default=default, metadata={"help": text})


@dataclass
class AlgoConfig:
    objective: Literal["ppo", "decoupled", "dg"] = doc("ppo | decoupled (AReaL) | dg (Delightful PG)", "ppo")
    group_size: int = doc("samples per prompt (G)", 8)
    batch_groups: int = doc("prompt groups per training step (B)", 32)
    minibatches: int = doc("optimizer steps per training step (PPO mini-batches)", 1)
    ppo_epochs: int = doc("passes over each batch", 1)
    clip_eps_low: float = doc("PPO clip: ratio >= 1 - eps_low", 0.2)
    clip_eps_high: float = doc("PPO clip: ratio <= 1 + eps_high (DAPO 'clip higher' uses 0.28)", 0.2)
    adv_std_norm: bool = doc("divide group advantages by their std (false = Dr. GRPO)", True)
    drop_constant_groups: bool = doc("reject groups whose rewards are all equal (zero advantage: no gradient) "
                                     "and generate others in their place (DAPO's dynamic sampling); "
                                     "counted as groups_rejected", False)
    loss_agg: Literal["token-mean", "seq-mean", "constant"] = doc(
        "token-mean | seq-mean | constant (Dr. GRPO: sum / (batch * max_new_tokens))", "token-mean")
    kl_coef: float = doc("k3 KL penalty to the frozen reference; 0 frees the reference model", 0.0)
    behav_cap: float = doc("decoupled: cap on pi_prox / pi_behav", 5.0)
    # clamp, not mask (AReaL's choice): most tokens over the cap have A < 0 and masking them drops the
    # correction of bad tokens the policy has since made likelier (plots/decoupled-k8-tiny/report.md).
    behav_cap_mode: Literal["mask", "clamp"] = doc("decoupled: clamp the weight of tokens over the cap, or mask "
                                                   "them out", "clamp")
    prox: Literal["recompute", "loglinear"] = doc(
        "decoupled with several updates a step: pi_prox by a forward pass, or log-linear interpolation from "
        "token versions (with one update, either is the loss forward's own; ppo and dg compute none)", "recompute")
    dg_eta: float = doc("Delightful PG gate temperature", 1.0)
    tis_cap: float | None = doc(
        "truncated importance sampling on the engine/trainer mismatch (Yao et al. 2025): w = min(pi_old / "
        "pi_behav, C) per token, pi_old = the trainer's log-probs at the step's start (one extra no-grad forward "
        "when a step makes several updates); ppo: its ratio becomes (pi / pi_old) * w, clipped as before "
        "(inf = plain ppo); dg: w multiplies its loss (inf = full importance weight); decoupled: refused, its "
        "behaviour weight already does this (algo.behav_cap); null = off", None)
    lr: float = doc("AdamW learning rate", 1e-4)
    embedding_lr_scale: float = doc(
        "the token embedding's learning rate (and its tied head's) as a multiple of algo.lr; 0 freezes them. "
        "Adam moves every row of a 262k-word tied head (Gemma) by about lr each step, never-sampled words "
        "included (docs/models.md#gemma-3-270m)", 1.0)
    weight_decay: float = doc("AdamW weight decay", 0.0)
    adam_beta2: float = doc("AdamW beta2", 0.99)
    grad_clip: float = doc("gradient-norm clip (0 disables)", 1.0)
    warmup_steps: int = doc("linear learning-rate warmup, in optimizer steps", 0)

    def __post_init__(self) -> None:
        check_fields("algo", self)


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
        "module whose own forward differs keeps it (models/ops.py)", True)
    skip_zero_advantage: bool = doc(
        "leave samples whose advantage is exactly 0 out of the forward and backward: their gradient is zero, and "
        "they still count in the loss's normalisers, so the update is the same (entropy and the behaviour "
        "statistics then cover the computed samples; off with algo.kl_coef > 0, whose penalty has a gradient)", True)
    max_logprob_gap: float = doc("stop the run when a step's logprob_gap_max (generator vs trainer, nats) exceeds "
                                 "it; 0 = 0.05 when both compute in fp32, else 2.0 (none with recompute_kv=false)", 0.0)

    def __post_init__(self) -> None:
        check_fields("train", self)


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
        check_fields("sft", self)


@dataclass
class WarmupConfig:
    target_pass_rate: float = doc("tiny model: supervised warm-start stops at this held-out pass rate", 0.3)
    max_steps: int = doc("tiny model: warm-start step limit", 3000)
    batch_size: int = doc("tiny model: warm-start batch size", 128)
    lr: float = doc("tiny model: warm-start learning rate", 1e-3)
    ops: str = doc("tiny model: operators of the warm-start's sums (empty = arithmetic.ops)", "")
    digits: int = doc("tiny model: operands of 1 to this many digits in the warm-start, each length equally "
                      "likely (0 = arithmetic.digits, drawn as the task draws them)", 0)
    calls: bool = doc("tiny model: teach the calculator episode's call format (a+b=[a+b]{c}c) instead "
                      "of direct answers (the calculator episode's warm-start)", False)

    extra_ops: str = doc("tiny model: operators the warm-start also teaches with one short operand "
                         "(warmup.extra_digits; the other of up to warmup.digits), a quarter of each batch", "")
    extra_digits: int = doc("tiny model: max digits of the short operand of those (1: products by one digit, "
                            "12345*6 and 6*12345)", 1)
    extra_calls: float = doc("tiny model: the fraction of those taught in the calculator's call format (with "
                             "warmup.calls; the rest answered directly)", 0.0)

    def __post_init__(self) -> None:
        check(not set(self.ops) - set("+-*%"), "warmup.ops", f"must use only '+-*%', got '{self.ops}'")
        check(not set(self.extra_ops) - set("+-*%"), "warmup.extra_ops", f"must use only '+-*%', got "
              f"'{self.extra_ops}'")
        check_fields("warmup", self)


@dataclass
class ToolsConfig:
    """Tools episodes call (data.episode): data in, data out, each call under a timeout."""

    names: list[str] = doc("built-in tools episodes may call: calculator (arithmetic by parsing, bounded)",
                           ["calculator"])
    functions: list[str] = doc("your own tools by import path, 'path/to/tools.py:fn' (async def fn(arg: str) -> str; "
                               "a plain def runs in a thread); the tool's name is the function's", [])
    timeout_s: float = doc("time one tool call may take; past it the episode observes an error (tool_errors)", 5.0)
    max_calls: int = doc("tool calls one episode may make (more are answered with an error)", 8)
    max_threads: int = doc("threads your tools run in (plain and async def alike, each call on one); a call that "
                           "overruns timeout_s keeps its thread until it returns, and while all are held so, calls "
                           "fail at once (tool_errors) instead of starting more", 64)
    latency_ms: list[float] = doc("a simulated slow world: each call first sleeps a seeded random time in [lo, hi] "
                                  "milliseconds (one value: exactly that); empty = none", [])

    def __post_init__(self) -> None:
        check_fields("tools", self)
