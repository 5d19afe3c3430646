"""What `simulate` prints: the prediction table, its JSON, and prediction against a `bench e2e`
measurement (`--against`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import UserError
from .contention import Topology
from .cost_profile import Profile
from .lengths import length_sampler
from .simulated_run import Result, Setting, simulate

BENCH_MODES = (("sync", "sync"), ("one-step", "one_step"), ("async", "async"))


def histogram(staleness: dict[int, int]) -> str:
    total = sum(staleness.values()) or 1
    return " ".join(f"{k}:{100 * n / total:.0f}%" for k, n in sorted(staleness.items()))


def print_table(profile: Profile, topology: Topology, s: Setting, lengths: str, results: list[Result]) -> None:
    print(f"simulate: profile {profile.name} ({profile.kind}: {profile.device}, {profile.model}), {topology.label()}")
    print(f"  workload: B={s.batch_groups} x G={s.group_size} per cell, {s.prompt_len}-token prompts, {lengths}, "
          f"{s.warmup_steps} warm-up + {s.steps} timed steps per mode; every figure below is a prediction")
    print(f"  {'mode':<9}{'K':>3}{'samples/s':>11}{'s/step':>9}{'vs sync':>9}{'gen idle':>10}{'train idle':>12}"
          f"{'interrupted':>13}  staleness (share of samples)")
    sync = results[0].samples_per_s
    for r in results:
        print(f"  {r.mode:<9}{r.k:>3}{r.samples_per_s:>11.2f}{r.s_per_step:>9.3f}{r.samples_per_s / sync:>8.2f}x"
              f"{100 * r.gen_idle:>9.0f}%{100 * r.train_idle:>11.0f}%{100 * r.interrupted:>12.0f}%  "
              f"{histogram(r.staleness)}")
    took = sum(r.sim_seconds for r in results)
    print(f"  (simulated {len(results)} x {s.warmup_steps + s.steps} steps in {took:.1f} s)")


def result_json(results: list[Result]) -> dict[str, Any]:
    sync = results[0].samples_per_s
    out: dict[str, Any] = {}
    for r in results:
        key = r.mode.replace("-", "_") + (f"_k{r.k}" if r.mode == "async" else "")
        out.update({f"{key}_samples_s": r.samples_per_s, f"{key}_s_per_step": r.s_per_step,
                    f"{key}_vs_sync": r.samples_per_s / sync, f"{key}_gen_idle": r.gen_idle,
                    f"{key}_train_idle": r.train_idle, f"{key}_staleness_mean": r.staleness_mean,
                    f"{key}_staleness": {str(k): n for k, n in r.staleness.items()},
                    f"{key}_interrupted": r.interrupted})
    return out


def bench_lines(path: str) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--against {path}: no such file (write one with `bench e2e ... --out FILE`)")
    lines = [json.loads(line) for line in p.read_text().splitlines() if line.strip().startswith("{")]
    lines = [line for line in lines if line.get("bench") == "e2e"]
    if not lines:
        raise UserError(f"--against {path}: no `bench e2e` JSON line in it")
    return lines


def setting_of_bench(line: dict[str, Any]) -> Setting:
    """The bench's exact workload: its steps, seed (hence its forced lengths) and instant rewards."""
    return Setting(line["batch_groups"], line["group_size"], line["prompt_len"], line["slots"], line["steps"],
                   line["warmup_steps"], line.get("seed", 0), reward_s=0.0)


def against_rows(profile: Profile, topology: Topology, path: str) -> list[dict[str, Any]]:
    rows = []
    for line in bench_lines(path):
        setting = setting_of_bench(line)
        draw = length_sampler(line["length_dist"], line["mean_len"], line["max_new_tokens"])
        for mode, key in BENCH_MODES:
            if f"{key}_samples_s" not in line:
                continue
            k = line["max_staleness"] if mode == "async" else (1 if mode == "one-step" else 0)
            r = simulate(profile, setting, topology, draw, mode, k)
            measured = line[f"{key}_samples_s"]
            rows.append({"length_dist": line["length_dist"], "mean_len": line["mean_len"], "mode": mode, "k": k,
                         "measured_samples_s": measured, "predicted_samples_s": r.samples_per_s,
                         "error": r.samples_per_s / measured - 1, "measured_gen_idle": line.get(f"{key}_gen_idle"),
                         "predicted_gen_idle": r.gen_idle, "measured_train_idle": line.get(f"{key}_train_idle"),
                         "predicted_train_idle": r.train_idle,
                         "measured_interrupted": line.get(f"{key}_interrupted"),
                         "predicted_interrupted": r.interrupted})
    return rows


def _pair(measured: float | None, predicted: float) -> str:
    return f"{'-' if measured is None else format(100 * measured, '.0f')}/{100 * predicted:.0f}%"


def print_against(profile: Profile, topology: Topology, rows: list[dict[str, Any]]) -> None:
    print(f"simulate --against: profile {profile.name} ({profile.kind}), {topology.label()}")
    print(f"  {'lengths':<16}{'mode':<9}{'K':>3}{'measured':>10}{'predicted':>11}{'error':>8}"
          f"{'gen idle m/p':>15}{'train idle m/p':>17}{'interrupted m/p':>18}")
    for r in rows:
        print(f"  {r['length_dist'] + ' ' + format(r['mean_len'], 'g'):<16}{r['mode']:<9}{r['k']:>3}"
              f"{r['measured_samples_s']:>10.2f}{r['predicted_samples_s']:>11.2f}{100 * r['error']:>+7.1f}%"
              f"{_pair(r['measured_gen_idle'], r['predicted_gen_idle']):>15}"
              f"{_pair(r['measured_train_idle'], r['predicted_train_idle']):>17}"
              f"{_pair(r.get('measured_interrupted'), r.get('predicted_interrupted', 0.0)):>18}")
    for line in sorted({(r["length_dist"], r["mean_len"]) for r in rows}):
        by_mode = {r["mode"]: r for r in rows if (r["length_dist"], r["mean_len"]) == line}
        if "sync" in by_mode:
            ratios = [f"{m}/sync measured {r['measured_samples_s'] / by_mode['sync']['measured_samples_s']:.2f}x, "
                      f"predicted {r['predicted_samples_s'] / by_mode['sync']['predicted_samples_s']:.2f}x"
                      for m, r in by_mode.items() if m != "sync"]
            print(f"  {line[0]} {line[1]:g}: " + "; ".join(ratios))
    worst = max(abs(r["error"]) for r in rows)
    print(f"  largest error {100 * worst:.1f}% (samples/s); m = measured by bench e2e, p = predicted")
