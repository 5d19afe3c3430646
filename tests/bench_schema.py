"""The JSON line each `python -m aioareal bench` run ends with: its keys, each with its type and
range, written down once. `check(line, schema)` asserts a line has exactly the schema's keys (less
the optional ones it lacks) and that every value fits; the bench tests call it once per line and
otherwise assert behaviour (token counts, parameter counts, which layout computes fewer positions),
never a figure re-derived from the same line."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Field:
    what: str  # how a failure describes the expected value
    fits: Callable[[Any], bool]
    optional: bool = False  # the key may be absent


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


TEXT = Field("a non-empty string", lambda v: isinstance(v, str) and v != "")
FLAG = Field("true or false", lambda v: isinstance(v, bool))
COUNT = Field("an integer >= 0", lambda v: _integer(v) and v >= 0)
SIZE = Field("an integer > 0", lambda v: _integer(v) and v > 0)
POSITIVE = Field("a finite number > 0", lambda v: _number(v) and v > 0)  # timings, rates, ratios, sizes
AT_LEAST_ZERO = Field("a finite number >= 0", lambda v: _number(v) and v >= 0)  # a phase that may not have run
FRACTION = Field("a number in [0, 1]", lambda v: _number(v) and 0 <= v <= 1)


def nullable(f: Field) -> Field:
    return Field(f"{f.what} or null", lambda v: v is None or f.fits(v))


def optional(f: Field) -> Field:
    return replace(f, optional=True)


def exactly(*values: Any) -> Field:
    return Field(f"one of {values}", lambda v: v in values)


def list_of(f: Field) -> Field:
    return Field(f"a non-empty list of {f.what}", lambda v: isinstance(v, list) and v != [] and all(map(f.fits, v)))


def check(line: dict[str, Any], *schemas: dict[str, Field]) -> None:
    """`line` has every key of `schemas` (optional ones aside) and no other, each value fitting."""
    schema = {k: f for s in schemas for k, f in s.items()}
    missing = [k for k, f in schema.items() if k not in line and not f.optional]
    extra = [k for k in line if k not in schema]
    wrong = [f"{k}={line[k]!r} is not {schema[k].what}" for k in line if k in schema and not schema[k].fits(line[k])]
    assert not (missing or extra or wrong), f"missing {missing}, unexpected {extra}, wrong {wrong}"


ENVIRONMENT = {"device": TEXT, "device_name": TEXT, "torch": TEXT, "transformers": TEXT, "threads": SIZE}
DTYPE = exactly("float32", "bfloat16", "float16")

# The machine's own matmul peak (bench/peak.py), measured in every round of gen, train and e2e.
PROBES = Field("a list of numbers > 0", lambda v: isinstance(v, list) and all(_number(x) and x > 0 for x in v))
PEAK = {"peak_fp32_gflops": nullable(POSITIVE), "peak_bf16_gflops": nullable(POSITIVE),
        "peak_source": exactly("measured_gemm", "datasheet", "none"), "peak_note": TEXT,
        "peak_fp32_gflops_probes": PROBES, "peak_bf16_gflops_probes": PROBES,
        "peak_mem_gbps": nullable(POSITIVE), "peak_mem_gbps_probes": PROBES}


ROOFLINE = {"roofline_frac": nullable(POSITIVE), "bound": nullable(exactly("compute", "memory"))}


def phase_figures(phase: str) -> dict[str, Field]:
    """A phase's FLOP count and achieved rate against the peak (bench/flops.py)."""
    return {f"{phase}_flops": SIZE, f"{phase}_gflops": POSITIVE, f"{phase}_peak_frac": nullable(POSITIVE),
            **{f"{phase}_{k}": kind for k, kind in ROOFLINE.items()}}


GEN = {
    "bench": exactly("gen"), **ENVIRONMENT, "model": TEXT, "dtype": DTYPE, "prompts": SIZE, "samples": SIZE,
    "prompt_len": SIZE, "new_tokens": SIZE, "slots": SIZE, "cuda_graphs": FLAG, "compile": FLAG, "repeats": SIZE,
    "engine_tokens": SIZE, "generate_tokens": SIZE, "engine_s": POSITIVE, "generate_s": POSITIVE,
    "engine_s_rounds": list_of(POSITIVE), "generate_s_rounds": list_of(POSITIVE), "engine_tok_s": POSITIVE,
    "generate_tok_s": POSITIVE, "ratio": POSITIVE, "param_bytes": SIZE, "kv_bytes_per_token": SIZE,
    "engine_gbps": POSITIVE, "generate_gbps": POSITIVE, "peak_gbps": nullable(POSITIVE),
    "engine_roofline_frac": nullable(POSITIVE), "generate_roofline_frac": nullable(POSITIVE),
    "engine_ceiling_tok_s": nullable(POSITIVE), "engine_peak_mem_gb": nullable(POSITIVE),
    "generate_peak_mem_gb": nullable(POSITIVE), "fused": FLAG, "overlap": FLAG, "shared_prefix": FLAG,
    "common_prefix": COUNT, **PEAK, **{f"{phase}_{k}": kind for phase in ("decode", "prefill")
               for k, kind in (("tokens", SIZE), ("s", POSITIVE))},
    **phase_figures("decode"), **phase_figures("prefill"),
}
GEN_COMPARE_FUSION = {"unfused_s_rounds": list_of(POSITIVE), "unfused_tok_s": POSITIVE, "fused_vs_unfused": POSITIVE}
GEN_COMPARE_OVERLAP = {"overlap_on_tok_s": POSITIVE, "overlap_off_tok_s": POSITIVE, "overlap_vs_plain": POSITIVE}
GEN_COMPARE_COMMON_PREFIX = {"whole_prompts_tok_s": POSITIVE, "prefix_vs_whole": POSITIVE}
GEN_COMPARE_SHARED_PREFIX = {"shared_on_tok_s": POSITIVE, "shared_off_tok_s": POSITIVE, "shared_vs_plain": POSITIVE}

TRAIN_VARIANTS = ("packed_chunked", "packed_naive", "padded_chunked")
TRAIN = {
    "bench": exactly("train"), **ENVIRONMENT, "model": TEXT, "autocast": nullable(DTYPE), "samples": SIZE,
    "prompt_len": SIZE, "mean_len": POSITIVE, "max_len": SIZE, "budget": SIZE, "chunk": SIZE, "repeats": SIZE,
    "compile": FLAG, "compile_s": nullable(POSITIVE), "packed_micro_batches": SIZE, "padded_micro_batches": SIZE,
    "packed_padding_frac": FRACTION, "padded_padding_frac": FRACTION,
    **{f"{v}_tok_s": POSITIVE for v in TRAIN_VARIANTS},
    **{f"{v}_peak_mem_gb": nullable(POSITIVE) for v in TRAIN_VARIANTS},
    "peak_mem_kind": exactly("cuda_max_memory_allocated", "analytic_logits_bytes"), "chunked_logits_gb": POSITIVE,
    "naive_logits_gb": POSITIVE, "chunked_vs_naive_tok_s": POSITIVE, "packed_vs_padded_tok_s": POSITIVE,
    "non_embedding_params": SIZE, "peak_tflops": nullable(POSITIVE),
    **{f"{v}_mfu": nullable(POSITIVE) for v in TRAIN_VARIANTS},
    "publish_mb": POSITIVE, "publish_ms": POSITIVE, "adopt_ms": POSITIVE,
    **PEAK, "compute_dtype": DTYPE, "rss_peak_kind": nullable(exactly("cpu_rss_high_water")), "rss_peak_note": TEXT,
    **{f"{v}_s": POSITIVE for v in TRAIN_VARIANTS}, **{f"{v}_rss_peak_gb": nullable(POSITIVE) for v in TRAIN_VARIANTS},
    **{k: f for v in TRAIN_VARIANTS for k, f in phase_figures(v).items()},
}
TRAIN_LAYOUTS = {
    "bench": exactly("train_layouts"), **ENVIRONMENT, "model": TEXT, "groups": SIZE, "group_size": SIZE,
    "answers": COUNT, "prompt_len": SIZE, "mean_len": POSITIVE, "max_len": SIZE, "budget": SIZE, "repeats": SIZE,
    **{f"{layout}_{k}": kind for layout in ("padded", "shared", "tree") for k, kind in (("s", POSITIVE),
                                                                                    ("positions", SIZE))},
    "tree_vs_shared": POSITIVE, "tree_vs_padded": POSITIVE,
}
TRAIN_LORA = {
    "bench": exactly("train"), "variant": exactly("lora_vs_full"), **ENVIRONMENT, "model": TEXT, "lora_rank": SIZE,
    "lora_alpha": POSITIVE, "autocast": nullable(DTYPE), "samples": SIZE, "prompt_len": SIZE, "mean_len": POSITIVE,
    "budget": SIZE, "repeats": SIZE, "micro_batches": SIZE, "trainable_params": SIZE, "total_params": SIZE,
    **{f"{side}_{k}": kind for side in ("full", "lora") for k, kind in (
        ("tok_s", POSITIVE), ("state_gb", POSITIVE), ("step_peak_gb", nullable(POSITIVE)), ("publish_mb", POSITIVE),
        ("publish_s", POSITIVE))},
    "lora_vs_full_tok_s": POSITIVE, "lora_vs_full_state": POSITIVE, "lora_vs_full_publish_bytes": POSITIVE,
}
TRAIN_PRECISION = {
    "bench": exactly("train"), "variant": exactly("precision"), **ENVIRONMENT, "model": TEXT, "samples": SIZE,
    "group_size": SIZE, "prompt_len": SIZE, "mean_len": POSITIVE, "max_len": SIZE, "budget": SIZE, "chunk": SIZE,
    "repeats": SIZE, "fp32_matmuls": FLAG,
    "peak_mem_kind": exactly("cuda_max_memory_allocated", "cpu_rss_high_water"),
    **{f"{side}_{k}": kind for side in ("autocast", "masters") for k, kind in (
        ("step_s", POSITIVE), ("peak_gb", POSITIVE), ("loaded_gb", POSITIVE), ("after_step_gb", POSITIVE),
        ("first_loss", Field("a finite number", _number)), ("saved_mb_per_position", POSITIVE),
        ("saved_fixed_mb", Field("a finite number", _number)))},
    "masters_vs_autocast_peak": POSITIVE, "masters_vs_autocast_step_s": POSITIVE,
}
HEAD = {
    "bench": exactly("head"), **ENVIRONMENT, "tokens": SIZE, "hidden": SIZE, "vocab": SIZE, "chunk": SIZE,
    "dtype": DTYPE, "checkpoint_s": POSITIVE, "fused_s": POSITIVE, "speedup": POSITIVE,
    "checkpoint_peak_mb": nullable(POSITIVE), "fused_peak_mb": nullable(POSITIVE), "memory_ratio": nullable(POSITIVE),
    "peak_mem_kind": exactly("cuda_max_allocated", "cpu_rss_high_water"),
}

# `bench e2e`: the run's shape, then per mode its figures and the seconds per timed step in each
# named phase (the trainer's always run; a generator phase may be 0: async can generate every
# timed batch during the warm-up; adopt and recompute_kv happen only when new weights arrive).
E2E = {
    "bench": exactly("e2e"), **ENVIRONMENT, "model": TEXT, "dtype": DTYPE, "batch_groups": SIZE, "group_size": SIZE,
    "slots": SIZE, "prompt_len": SIZE, "max_new_tokens": SIZE, "length_dist": exactly("gsm8k", "uniform", "fixed"),
    "mean_len": POSITIVE, "max_staleness": COUNT, "steps": SIZE, "warmup_steps": COUNT, "seed": COUNT,
    "micro_batch_tokens": SIZE, **PEAK,
}
TRAIN_PHASES = ("advantages", "pack", "fixed_logprobs", "loss", "optimizer", "publish")
GEN_PHASES = ("admit", "prefill", "decode", "sync", "bookkeep", "score")
GEN_PHASES_ON_NEW_WEIGHTS = ("adopt", "recompute_kv")


def e2e_mode(mode: str) -> dict[str, Field]:
    """One mode's keys in a `bench e2e` line (mode: sync, one_step or async)."""
    keys = {"samples_s": POSITIVE, "s_per_step": POSITIVE, "s_per_step_median": POSITIVE, "gen_idle": FRACTION,
            "train_idle": FRACTION, "len_mean": POSITIVE, "staleness_max": COUNT, "interrupted": FRACTION,
            **{f"time_{p}_s": POSITIVE for p in TRAIN_PHASES}, **{f"time_gen_{p}_s": AT_LEAST_ZERO for p in GEN_PHASES},
            **{f"time_gen_{p}_s": optional(AT_LEAST_ZERO) for p in GEN_PHASES_ON_NEW_WEIGHTS},
            # FLOPs against the peak: async may decode every timed batch during the warm-up (none timed).
            "decode_tokens_per_step": AT_LEAST_ZERO, "decode_gflops": nullable(AT_LEAST_ZERO),
            "decode_peak_frac": nullable(AT_LEAST_ZERO), "loss_positions_per_step": POSITIVE,
            "loss_head_positions_per_step": POSITIVE, "loss_dtype": DTYPE, "loss_gflops": POSITIVE,
            "loss_peak_frac": nullable(POSITIVE),
            **{f"{phase}_{k}": kind for phase in ("decode", "loss") for k, kind in ROOFLINE.items()}}
    out = {f"{mode}_{k}": kind for k, kind in keys.items()}
    if mode != "sync":
        out[f"{mode}_vs_sync"] = POSITIVE
    return out


PEAK_BENCH = {"bench": exactly("peak"), **ENVIRONMENT, **PEAK}

REWARD = {
    "bench": exactly("reward"), "completions": SIZE, "mean_chars": SIZE, "workers": SIZE, "cores": SIZE,
    "single_cps": POSITIVE, "pool_cps": POSITIVE, "service_cps": POSITIVE, "single_cpu_cps": POSITIVE,
    "pool_vs_single": POSITIVE,
}
REWARD_AGREEMENT = {"cases": SIZE, **{f"{k}_{grader}": kind for grader in ("ours", "strict_regex", "flexible_regex",
                                                                            "math_verify")
                                      for k, kind in (("agree", FRACTION), ("false_pass", COUNT),
                                                      ("false_fail", COUNT))}}
# The same graders on the hand-labelled real completions (tests/data/grading/real_completions.jsonl).
GRADERS = ("ours", "strict_regex", "flexible_regex", "math_verify")
REWARD_AGREEMENT["real_rows"] = SIZE
REWARD_AGREEMENT.update({f"real_{k}_{grader}": kind for grader in GRADERS
                         for k, kind in (("pass", FRACTION), ("agree", FRACTION), ("false_pass", COUNT),
                                         ("false_fail", COUNT))})
REWARD_AGREEMENT.update({f"real_differ_{grader}": COUNT for grader in GRADERS[1:]})

PROFILE = {
    "bench": exactly("profile"), "path": TEXT, "name": TEXT, "device": TEXT, "model": TEXT,
    "decode_a_ms": AT_LEAST_ZERO, "decode_b_us": AT_LEAST_ZERO, "decode_c_ns": AT_LEAST_ZERO,
    "decode_fit_worst": AT_LEAST_ZERO, "prefill_fit_worst": AT_LEAST_ZERO, "train_a_s": AT_LEAST_ZERO,
    "train_b_us": AT_LEAST_ZERO, "train_fit_worst": AT_LEAST_ZERO, "publish_s": POSITIVE, "adopt_s": POSITIVE,
    "reward_s": POSITIVE, "contention_gen": Field("a number >= 1", lambda v: _number(v) and v >= 1),
    "contention_train": Field("a number >= 1", lambda v: _number(v) and v >= 1),
}
