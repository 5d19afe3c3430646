"""`bench profile`: measure a cost profile of this device for `python -m aioareal simulate`, and
write it as JSON (aioareal/lab/simulate/cost_profile.py describes the format).

It builds what `bench e2e` builds for the same flags (random weights, the run's slots, context and
micro-batch budget) and measures, through the same workers the orchestrator drives: decode steps
at a grid of batch sizes and attention spans, the prefill of the admission step, training steps at
several batch token counts (publish timed apart), adopting a version, one group's reward round trip,
and the contention of a single-device cell (a train step while the generator decodes vs alone, and
a decode step while training vs alone). Each curve is a few points with a least-squares fit; the
file keeps the points, so a reader can judge the fit.
"""
from __future__ import annotations

import argparse
import math
import platform
import random
from pathlib import Path
from statistics import median
from typing import Any

import torch

from ...errors import UserError
from ...run.build import Models, build_engine, build_trainer, build_workers
from ...run.events import run_event_loop
from ..simulate.cost_profile import Contention, DecodeCost, PrefillCost, Profile, TrainCost
from .e2e import setup_arguments
from .gen import eos_ids
from .harness import build_model, model_label, pick_device, pick_dtype, timed
from .measure import contention, engine_points, reward_seconds, synthetic_groups, train_point
from .parts import e2e_config

# Tokens the profiling engine may generate per sequence: prompts up to the context minus this are
# allowed, so decode is measured at long spans without generating up to them.
PROFILE_NEW_TOKENS = 48
# Alone / together rounds of the contention measurement (it is the noisiest figure on a shared machine).
CONTENTION_ROUNDS = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    setup_arguments(p)
    p.add_argument("--mean-len", type=float, default=200.0,
                   help="mean completion length of the training points (GSM8K-like spread; default 200)")
    p.add_argument("--repeats", type=int, default=8, help="decode steps timed per grid point (default 8)")
    p.add_argument("--write", help="profile path (default configs/profiles/<device>-<model>.json)")
    p.add_argument("--name", help="the profile's name (default: from the device and model)")


def _check(args: argparse.Namespace) -> None:
    if args.repeats < 1 or args.mean_len <= 0 or args.prompt_len < 1:
        raise UserError("--repeats and --prompt-len must be >= 1 and --mean-len > 0")
    if args.group_size < 2 or args.batch_groups < 1:
        raise UserError("--group-size must be >= 2 and --batch-groups >= 1")
    if args.slots and args.slots < args.group_size:
        raise UserError(f"--slots {args.slots} cannot hold one group of --group-size {args.group_size}")


def build(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, int, int]:
    """Generator and trainer workers as bench e2e builds them; the engine's context is the run's
    (prompt + completion cap), its per-sequence budget short (see PROFILE_NEW_TOKENS)."""
    config = e2e_config(args, "async", 2, steps=1)
    config.generation.max_new_tokens = PROFILE_NEW_TOKENS
    gen_model = build_model(args.model, dtype, device, args.seed)
    train_model = build_model(args.model, torch.float32, device, args.seed)
    max_len = args.prompt_len + args.max_new_tokens
    if max_len < 2 * PROFILE_NEW_TOKENS:
        raise UserError(f"--prompt-len + --max-new-tokens = {max_len}: profile needs at least {2 * PROFILE_NEW_TOKENS}")
    engine = build_engine(config, gen_model, eos_ids(gen_model), max_len, compile=args.compile)
    trainer = build_trainer(config, Models(gen_model, train_model, None, dtype), train_model.config.pad_token_id or 0)
    # A bench forces lengths past EOS on random weights: it reports the gap, it is no run to stop.
    trainer.max_logprob_gap = math.inf
    generator, trainer_worker = build_workers(engine, trainer, gen_model, lambda: {})
    params = sum(p.numel() for p in train_model.parameters())
    return generator, trainer_worker, max_len, params


def widths(prompt_len: int, max_len: int) -> list[int]:
    top = max_len - PROFILE_NEW_TOKENS
    return sorted({max(4, prompt_len // 4), min(prompt_len, top), (prompt_len + top) // 2, top})


async def measure(args: argparse.Namespace, gen: Any, trainer: Any, max_len: int, vocab: int) -> dict[str, Any]:
    size, slots = args.group_size, args.slots or args.batch_groups * args.group_size
    rng = random.Random(args.seed)
    print("  decode and prefill grid ...", flush=True)
    engine = await engine_points(gen, size, slots, widths(args.prompt_len, max_len), args.repeats, vocab, args.seed)
    print("  training steps ...", flush=True)
    train, publish = [], []
    for factor in (1.0, 0.5, 1.0, 2.0, 0.5, 1.0, 2.0):  # the first is a warm-up (optimizer state, allocator)
        groups = synthetic_groups(args.batch_groups, size, args.prompt_len, args.mean_len * factor,
                                  args.max_new_tokens, trainer.version, vocab, rng)
        tokens, seconds, pub = await train_point(trainer, groups)
        train.append([tokens, seconds])
        publish.append(pub)
    train, publish = train[1:], publish[1:]
    adopt, _ = timed(lambda: gen.sync.apply(gen.engine.stream), gen.engine.device)
    print("  contention (training while decoding) ...", flush=True)
    groups = synthetic_groups(args.batch_groups, size, args.prompt_len, args.mean_len, args.max_new_tokens,
                              trainer.version, vocab, rng)
    shared = await contention(gen, trainer, groups, size, min(args.prompt_len + int(args.mean_len), max_len - 64),
                              PROFILE_NEW_TOKENS, CONTENTION_ROUNDS, vocab, args.seed)
    reward = await reward_seconds(size, 8)
    return {"engine": engine, "train": train, "train_budget": trainer.trainer.micro_batch_tokens,
            "train_share": trainer.trainer.layouts.share, "publish": median(publish), "adopt": adopt,
            "contention": shared, "reward": reward}


def profile_of(args: argparse.Namespace, m: dict[str, Any], device: torch.device, dtype: torch.dtype,
               params: int) -> Profile:
    c = m["contention"]
    how = (f"train step {c['train_alone_s']:.3f} s alone, {c['train_with_decode_s']:.3f} s while every slot "
           f"decodes; decode step {1e3 * c['decode_alone_s']:.2f} ms alone, {1e3 * c['decode_with_train_s']:.2f} ms "
           f"while training (mean of {c['decode_steps_inside']} steps)")
    name = args.name or f"{device.type}-{args.model}"
    setup = {k: getattr(args, k) for k in ("batch_groups", "group_size", "prompt_len", "max_new_tokens", "slots",
                                           "micro_batch_tokens", "mean_len", "compile", "cuda_graphs", "threads")}
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return Profile(
        name=name, kind="measured", device=f"{device} ({device_name}, {torch.get_num_threads()} threads)",
        model=model_label(args.model), dtype=str(dtype).replace("torch.", ""),
        decode=DecodeCost.fitted(m["engine"].decode), prefill=PrefillCost.fitted(m["engine"].prefill),
        train=TrainCost.fitted(m["train"], unit="positions", budget=m["train_budget"], share=m["train_share"]),
        publish_s=m["publish"], adopt_s=m["adopt"], reward_s=m["reward"],
        contention=Contention(max(1.0, c["decode_with_train_s"] / c["decode_alone_s"]),
                              max(1.0, c["train_with_decode_s"] / c["train_alone_s"]), how),
        param_count=params, setup=setup,
        notes=[f"measured by `python -m aioareal bench profile` with torch {torch.__version__}"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    _check(args)
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    print(f"bench profile: {model_label(args.model)} on {device} ({str(dtype).replace('torch.', '')}), "
          f"B={args.batch_groups} x G={args.group_size}, {args.prompt_len}-token prompts, cap {args.max_new_tokens}",
          flush=True)
    gen, trainer, max_len, params = build(args, device, dtype)
    try:
        m = run_event_loop(measure(args, gen, trainer, max_len, gen.engine.model.config.vocab_size))
    finally:
        gen.close()
        trainer.close()
    profile = profile_of(args, m, device, dtype, params)
    path = Path(args.write or f"configs/profiles/{profile.name}.json")
    profile.save(path)
    return summary(profile, path)


def summary(p: Profile, path: Path) -> dict[str, Any]:
    def worst(cost: Any) -> float:  # the fit's largest relative miss over its own points
        return max(abs(f - pt[-1]) / pt[-1] for f, pt in zip(cost.predicted(), cost.points))

    out = {"bench": "profile", "path": str(path), "name": p.name, "device": p.device, "model": p.model,
           "decode_a_ms": 1e3 * p.decode.a, "decode_b_us": 1e6 * p.decode.b, "decode_c_ns": 1e9 * p.decode.c,
           "decode_fit_worst": worst(p.decode), "prefill_fit_worst": worst(p.prefill),
           "train_a_s": p.train.a, "train_b_us": 1e6 * p.train.b, "train_fit_worst": worst(p.train),
           "publish_s": p.publish_s, "adopt_s": p.adopt_s, "reward_s": p.reward_s,
           "contention_gen": p.contention.gen, "contention_train": p.contention.train}
    print(f"  decode step {out['decode_a_ms']:.3f} ms + {out['decode_b_us']:.2f} us/seq + "
          f"{out['decode_c_ns']:.3f} ns/(seq x span token) (fit within {100 * out['decode_fit_worst']:.0f}%)\n"
          f"  train step {p.train.a:.3f} s + {out['train_b_us']:.2f} us/token position (fit within "
          f"{100 * out['train_fit_worst']:.0f}%); publish {1e3 * p.publish_s:.2f} ms, adopt {1e3 * p.adopt_s:.2f} ms, "
          f"reward {1e3 * p.reward_s:.2f} ms/group\n  contention: {p.contention.how}\n  wrote {path}", flush=True)
    return out
