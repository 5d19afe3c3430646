"""`python -m aioareal simulate --profile FILE`: predicted samples/s, step time, idle fractions and
staleness of sync, one-step and async at each K, from a cost profile, on the real orchestrator
under the virtual clock; a table, one JSON line, and a plot of predicted speedup against K.
`--against BENCH.jsonl` instead simulates each `bench e2e` line's exact setting (same lengths, same
steps) and prints prediction against measurement. `simulate derive --from BASE --gpu NAME` writes a
profile derived from BASE for another GPU (aioareal/lab/simulate/gpus.py)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ...errors import UserError, guarded
from .contention import Topology
from .cost_profile import Profile, load_profile
from .gpus import GPUS, derive
from .lengths import Draw, sampler
from .prediction_report import against_rows, print_against, print_table, result_json
from .published import readme_h100
from .simulated_run import Result, Setting, simulate

BENCH_DEFAULTS = {"batch_groups": 8, "group_size": 8, "prompt_len": 128, "max_new_tokens": 768, "slots": 0}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m aioareal simulate", description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", required=True, help="cost profile JSON (bench profile, or configs/profiles/)")
    p.add_argument("--config", help="run config YAML: B, G, completion cap, slots, recompute_kv (flags override)")
    p.add_argument("--mode", choices=["sync", "one-step", "async", "all"], default="all",
                   help="all: sync, one-step and async at every --max-staleness (sync is always the baseline)")
    p.add_argument("--max-staleness", default="0,1,2,4,8",
                   help="K values of async, comma-separated (default 0,1,2,4,8)")
    for flag, what in (("batch-groups", "B"), ("group-size", "G"), ("prompt-len", "prompt tokens"),
                       ("max-new-tokens", "completion cap"), ("slots", "engine slots (0: B x G)")):
        p.add_argument(f"--{flag}", type=int, help=f"{what} (default: the config's, else bench e2e's)")
    p.add_argument("--lengths", default="gsm8k", help="gsm8k | uniform | fixed, or a run's samples.jsonl / run dir")
    p.add_argument("--mean-len", type=float, default=200.0, help="mean completion length (default 200)")
    p.add_argument("--steps", type=int, default=1000, help="timed steps per mode (default 1000)")
    p.add_argument("--warmup-steps", type=int, default=10, help="untimed steps first (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reward-s", type=float, help="seconds to score a group (default: the profile's)")
    p.add_argument("--recompute-kv", action=argparse.BooleanOptionalAction, default=None,
                   help="recompute running sequences' KV cache on a mid-rollout weight update (default: the "
                        "config's generation.recompute_kv, else on)")
    p.add_argument("--cells", type=int, default=1, help="cells training one model (all-reduce per step; default 1)")
    p.add_argument("--devices-per-cell", type=int, default=1, choices=[1, 2],
                   help="1: generator and trainer share a device (contention); 2: one each (default 1)")
    p.add_argument("--link-gbps", type=float, default=0.0, help="device-to-device GB/s (default: the profile's)")
    p.add_argument("--against", help="bench e2e JSONL: simulate each line's setting and compare samples/s")
    p.add_argument("--plot", help="speedup-vs-K PNG (default plots/simulate/<profile>.png; 'none': no plot)")
    p.add_argument("--out", help="append the JSON line to this JSONL file")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    return p


def ks(text: str) -> list[int]:
    try:
        values = sorted({int(k) for k in text.split(",") if k.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 0:
        raise UserError(f"--max-staleness {text}: expected comma-separated integers >= 0, like 0,1,2,4,8")
    return values


def setting_of(args: argparse.Namespace) -> tuple[Setting, int]:
    """The workload from flags > --config > bench e2e's defaults; also the completion cap."""
    shape = dict(BENCH_DEFAULTS)
    recompute = True
    if args.config:
        from ...config import load_config

        c = load_config(args.config)
        shape.update(batch_groups=c.algo.batch_groups, group_size=c.algo.group_size,
                     max_new_tokens=c.generation.max_new_tokens, slots=c.generation.num_slots)
        recompute = c.generation.recompute_kv
    shape.update({k: v for k in shape if (v := getattr(args, k)) is not None})
    recompute = recompute if args.recompute_kv is None else args.recompute_kv
    if min(shape["batch_groups"], shape["prompt_len"], shape["max_new_tokens"], args.steps) < 1 \
            or shape["group_size"] < 2:
        raise UserError("--batch-groups, --prompt-len, --max-new-tokens and --steps must be >= 1, --group-size >= 2")
    if args.warmup_steps < 0 or (args.reward_s is not None and args.reward_s < 0):
        raise UserError("--warmup-steps and --reward-s must be >= 0")
    setting = Setting(shape["batch_groups"], shape["group_size"], shape["prompt_len"], shape["slots"], args.steps,
                      args.warmup_steps, args.seed, args.reward_s, recompute)
    return setting, shape["max_new_tokens"]


def runs_of(args: argparse.Namespace) -> list[tuple[str, int]]:
    k_values = ks(args.max_staleness)
    out = [("sync", 0)]
    if args.mode in ("one-step", "all"):
        out.append(("one-step", 1))
    if args.mode in ("async", "all"):
        out += [("async", k) for k in k_values]
    return out


def predict(profile: Profile, setting: Setting, topology: Topology, draw: Draw,
            runs: list[tuple[str, int]]) -> list[Result]:
    return [simulate(profile, setting, topology, draw, mode, k) for mode, k in runs]


def run(args: argparse.Namespace) -> dict[str, Any]:
    profile = load_profile(args.profile)
    topology = Topology(args.cells, args.devices_per_cell, args.link_gbps)
    topology.check(profile)
    if args.against:
        rows = against_rows(profile, topology, args.against)
        print_against(profile, topology, rows)
        return {"simulate": "against", "profile": args.profile, "bench": args.against, "rows": rows}
    setting, cap = setting_of(args)
    draw, lengths = sampler(args.lengths, args.mean_len, cap)
    results = predict(profile, setting, topology, draw, runs_of(args))
    print_table(profile, topology, setting, lengths, results)
    if args.plot != "none":
        from .plot import plot_speedup

        path = Path(args.plot or f"plots/simulate/{profile.name}.png")
        plot_speedup(results, profile, topology, lengths, path)
        print(f"  plot: {path}")
    return {"simulate": "predict", "profile": args.profile, "profile_kind": profile.kind, "topology": topology.label(),
            "lengths": lengths, "batch_groups": setting.batch_groups, "group_size": setting.group_size,
            "steps": setting.steps, **result_json(results)}


def derive_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m aioareal simulate derive",
                                description="Write a profile derived from another by bandwidth and FLOPs scaling.")
    p.add_argument("--from", dest="base", required=True,
                   help="base profile JSON, or 'readme-h100' (the H100 profile built from the H100 session's figures)")
    p.add_argument("--gpu", required=True, help=f"target GPU: {', '.join(GPUS)}")
    p.add_argument("--write", required=True, help="where to write the derived profile")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    return p


def derive_main(argv: list[str]) -> int:
    args = derive_parser().parse_args(argv)

    def go() -> int:
        base = readme_h100() if args.base == "readme-h100" else load_profile(args.base)
        origin = "docs/log/2026-11-h100-session.md (readme-h100)" if args.base == "readme-h100" else args.base
        profile = base if args.base == "readme-h100" and args.gpu == "h100" else derive(base, args.gpu, origin)
        profile.save(args.write)
        print(f"wrote {args.write}: {profile.name} ({profile.kind}, {profile.device})")
        return 0
    return guarded(args.debug, go)


def main(argv: list[str]) -> int:
    if argv[:1] == ["derive"]:
        return derive_main(argv[1:])
    args = parser().parse_args(argv)

    def go() -> int:
        line = json.dumps(run(args))
        print(line, flush=True)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "a") as f:
                f.write(line + "\n")
        return 0
    return guarded(args.debug, go)
