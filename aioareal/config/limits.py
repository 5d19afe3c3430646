"""Valid values of single config fields, in one table: the range of every number (finite unless its
range admits inf), plus the device names and the prompt template, whose shape is checked too.

Every section checks its fields against this table when it is built (`check_fields` in its
`__post_init__`), from a YAML file, a flag, key=value or Python alike, so a value that can never work
(a NaN learning rate, a negative token limit, a zero batch, an Adam beta above 1) is refused at
config time with the valid range in the message, never met mid-run as a NaN loss or an overflow
(docs/reliability.md#bad-input-and-terminal-output). Checks that read several fields live in one
place, `Config.__post_init__` (schema.py).
"""
from __future__ import annotations

import dataclasses
import math
import re
import string
from typing import Any

from ..errors import ConfigError, UserError


def check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


INT_MAX = 2**31 - 1  # counts, sizes and steps: past this, tensor shapes and index arithmetic overflow
# Completions of one step (algo.batch_groups x algo.group_size) and of one group: the engine and the
# trainer hold a step's completions at once, so a count past these exhausts any machine's memory
# before the first check inside the run could say so. DeepSeek's and DAPO's recipes use 512-16k a
# step and 16-64 a group; these bounds leave room above both.
GROUP_MAX, STEP_COMPLETIONS_MAX = 65536, 1 << 20
SEED = "[0, 4294967295]"  # every RNG the run seeds (python, torch, numpy) takes these
TIMEOUT = "(0, 1000000]"  # seconds; past ~1e9 the OS timers (threading, asyncio) overflow

# Interval per field: [ ] closed, ( ) open; 'inf]' admits infinity (floats only). Ints whose range
# reads 'inf)' stop at INT_MAX. List fields are checked element by element.
RANGES: dict[str, str] = {
    "model.lora_rank": "[0, 4096]", "model.lora_alpha": "(0, inf)", "model.lora_dropout": "[0, 1)",
    "data.eval_size": "[0, inf)", "data.max_prompt_tokens": "[1, inf)", "data.shuffle_seed": SEED,
    "data.episode_timeout_s": TIMEOUT,
    "arithmetic.digits": "[1, 6]", "arithmetic.max_operand": "[0, 999999]",
    "reward.weights": "(-inf, inf)", "reward.workers": "[1, 1024]", "reward.timeout_s": TIMEOUT,
    "reward.memory_limit_mb": "[0, inf)",
    "tools.timeout_s": TIMEOUT, "tools.max_calls": "[0, inf)", "tools.latency_ms": "[0, 3600000]",
    "tools.max_threads": "[1, 4096]",
    "generation.max_new_tokens": "[1, inf)", "generation.temperature": "[0.001, inf)", "generation.top_p": "(0, 1]",
    "generation.num_slots": "[0, inf)",
    "algo.group_size": f"[2, {GROUP_MAX}]", "algo.batch_groups": f"[1, {STEP_COMPLETIONS_MAX // 2}]",
    "algo.minibatches": "[1, inf)",
    "algo.ppo_epochs": "[1, inf)", "algo.clip_eps_low": "[0, 1)", "algo.clip_eps_high": "[0, inf)",
    "algo.kl_coef": "[0, inf)", "algo.behav_cap": "(1, inf)", "algo.dg_eta": "(0, inf)", "algo.tis_cap": "(0, inf]",
    "algo.embedding_lr_scale": "[0, inf)",
    "algo.lr": "(0, inf)", "algo.weight_decay": "[0, inf)", "algo.adam_beta2": "[0, 1)", "algo.grad_clip": "[0, inf)",
    "algo.warmup_steps": "[0, inf)",
    "rollout.max_staleness": "[0, inf)", "rollout.devices_per_rank": "[1, 2]",
    "train.steps": "[0, inf)", "train.micro_batch_tokens": "[1, inf)", "train.logprob_chunk": "[1, inf)",
    "train.max_logprob_gap": "[0, inf)",
    "eval.every": "[0, inf)", "eval.max_new_tokens": "[1, inf)", "eval.samples": f"[0, {GROUP_MAX}]",
    "eval.temperature": "[0.001, inf)",
    "sft.steps": "[1, inf)", "sft.batch_size": "[1, inf)", "sft.micro_batch": "[1, inf)", "sft.lr": "(0, inf)",
    "sft.warmup_steps": "[0, inf)", "sft.max_tokens": "[1, inf)", "sft.eval_size": "[0, inf)",
    "sft.eval_every": "[0, inf)",
    "warmup.target_pass_rate": "(0, 1)", "warmup.max_steps": "[0, inf)", "warmup.batch_size": "[1, inf)",
    "warmup.lr": "(0, inf)", "warmup.digits": "[0, 6]", "warmup.extra_digits": "[1, 6]", "warmup.extra_calls": "[0, 1]",
    "run.seed": SEED, "run.sample_text_chars": "[0, inf)", "run.checkpoint_every": "[0, inf)",
    "run.keep_checkpoints": "[1, inf)", "run.stall_timeout_s": "[0, inf)", "run.cpu_threads": "[0, 4096]",
    "run.mmap_threshold_mb": "[0, 32]",
    "dist.timeout_s": TIMEOUT, "dist.world_size": "[0, inf)",
}
DEVICE = re.compile(r"auto|cpu|mps|(cuda|xpu)(:\d{1,3})?")
DEVICE_KEYS = ("rollout.gen_device", "rollout.train_device")
_INTERVAL = re.compile(r"([\[(])\s*([^,\s]+)\s*,\s*([^\]\s)]+)\s*([\])])")


def check_fields(section: str, values: Any) -> None:
    """Each field of a section's dataclass `values` against its rule in this module."""
    for f in dataclasses.fields(values):
        check_value(f"{section}.{f.name}", getattr(values, f.name))


def check_value(key: str, value: Any) -> None:
    """Refuse a value of `key` outside what it can ever be (ConfigError naming the valid range)."""
    for i, item in enumerate(value) if isinstance(value, list) else [(None, value)]:
        _check_one(key, item, key if i is None else f"{key}[{i}]")


def _check_one(key: str, value: Any, name: str) -> None:
    if key in DEVICE_KEYS and isinstance(value, str) and not DEVICE.fullmatch(value):
        raise ConfigError(name, f"expected auto, cpu, mps, cuda or cuda:N, got {value!r}")
    if key == "data.prompt_template" and isinstance(value, str):
        check_template(name, value)
    wrong = range_error(key, value)
    if wrong:
        raise ConfigError(name, wrong)


def range_error(key: str, value: Any) -> str | None:
    """Why the number `value` cannot be `key`'s ("must be in [1, 2147483647], got 0"), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    lo_open, lo, hi, hi_open = _parse(RANGES.get(key, "(-inf, inf)"))
    open_above = math.isinf(hi)  # the table sets no upper bound: the message names the lower one alone
    if isinstance(value, int):  # ints stop at INT_MAX where the table says inf
        lo = -INT_MAX - 1 if math.isinf(lo) else lo
        hi, hi_open = (INT_MAX, False) if math.isinf(hi) else (hi, hi_open)
    above = lo < value if lo_open else lo <= value
    below = value < hi if hi_open else value <= hi
    if above and below:  # NaN fails both
        return None
    finite = ("a finite number " if isinstance(value, float) and not math.isfinite(value)
              and not (hi == math.inf and not hi_open) else "")
    if open_above and not above and math.isfinite(lo):
        return f"must be {finite}{'>' if lo_open else '>='} {_fmt(lo)}, got {value!r}"
    if open_above and isinstance(value, int) and not below:
        return f"must be at most {INT_MAX}, got {value!r}"
    interval = f"{'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}{')' if hi_open else ']'}"
    return f"must be {finite}in {interval}, got {value!r}"


def check_flag(flag: str, key: str, value: Any, hint: str = "") -> None:
    """A command's flag that stands for config key `key` (chat's --max-new-tokens for
    generation.max_new_tokens): the key's range, the error in the flag's words."""
    wrong = range_error(key, value)
    if wrong:
        raise UserError(f"{flag} {wrong}{hint}")


def _parse(interval: str) -> tuple[bool, float, float, bool]:
    match = _INTERVAL.fullmatch(interval)
    if match is None:
        raise ValueError(f"bad interval {interval!r}")
    return match[1] == "(", float(match[2]), float(match[3]), match[4] == ")"


def _fmt(x: float) -> str:
    return str(int(x)) if math.isfinite(x) and x == int(x) else f"{x:g}"


MAX_SPEC_WIDTH = 10_000  # characters a placeholder's format spec may pad or cut to
_SPEC_NUMBER = re.compile(r"\d+")


def check_template(key: str, template: str) -> None:
    """A prompt template names row fields as {field} and nothing else: attribute or index access
    ({a.__class__}, {a[0]}) would read the row's objects like code, positional {} has no row field."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ConfigError(key, f"not a valid template ({e}); write a literal brace as {{{{ or }}}}") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if not name.isidentifier():
            raise ConfigError(key, f"placeholder {{{name}}}: expected a field name such as {{question}} (no "
                                   "attribute or index access, no positional {})")
        if conversion not in (None, "r", "s", "a") or "{" in (spec or ""):
            raise ConfigError(key, f"placeholder {{{name}}}: expected {{field}}, {{field!r}} or {{field:spec}} "
                                   "with a plain spec")
        widest = max((int(n) for n in _SPEC_NUMBER.findall(spec or "")), default=0)
        if widest > MAX_SPEC_WIDTH:  # {question:>9999999999} would allocate that many characters per prompt
            raise ConfigError(key, f"placeholder {{{name}:{spec}}}: a width or precision of at most {MAX_SPEC_WIDTH}, "
                                   f"got {widest}")


def check_run_shape(config: Any) -> None:
    """A run's slots and step against its groups, checked when a run's config is loaded (layering.py).
    Not in `Config.__post_init__`: `bench gen` builds engines whose slots hold fewer than a group."""
    g, a = config.generation, config.algo
    check(g.num_slots == 0 or g.num_slots >= a.group_size, "generation.num_slots",
          f"must hold at least one group (algo.group_size={a.group_size}), got {g.num_slots}")
    check(a.batch_groups * a.group_size <= STEP_COMPLETIONS_MAX, "algo.batch_groups",
          f"x algo.group_size is {a.batch_groups * a.group_size:,} completions a step; at most "
          f"{STEP_COMPLETIONS_MAX:,} fit a machine's memory (a step holds all of them at once)")
