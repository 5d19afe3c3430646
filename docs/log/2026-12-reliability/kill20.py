"""Issue 49, item 8: a SmolLM2-135M-Instruct run SIGKILLed 20 times and resumed each time, against the
same run never interrupted. Run from the repository root:

    python docs/log/2026-12-reliability/kill20.py OUT_DIR [--kills 20] [--seed 7] [--cores 0,1]

Both runs start at once (each on the core `--cores` names; the same core twice shares it). Each kill of
the interrupted run is drawn relative to its own progress, one of three kinds at random:
- `start-up`: 2-20 s after the (re)launch, before it has trained a step;
- `mid-step`: after the run logs a step it had not logged at its launch, a random part of a step later
  (anywhere in the next step: generation, training, the evaluation, the checkpoint);
- `mid-checkpoint`: the moment a checkpoint's temporary directory appears, plus 0-0.5 s.
It is then resumed with `--resume` (or started again when killed before its run directory existed). In
sync mode on the CPU a resumed run replays exactly, so every logged figure must equal the unbroken
run's. Prints one JSON line with each kill's moment and the comparison; exit status 0 when every check
holds.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

STEPS = 16
ARGS = ["--config", "configs/smollm2-sums.yaml", "--no-dashboard", "--steps", str(STEPS),
        "model.dtype=float32", "model.train_dtype=float32", "train.optimizer_moments=float32",
        "algo.batch_groups=4", "generation.max_new_tokens=32", "eval.every=8", "data.eval_size=50",
        "run.checkpoint_every=1", "run.keep_checkpoints=2"]
COMPARED = ("step", "version", "reward_mean", "loss", "grad_norm", "entropy", "eval_pass_rate", "groups_trained")


def launch(core: int, *args: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    out = open(log, "a")  # noqa: SIM115 -- the child writes it; closed with the process
    return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-m", "aioareal", *args],
                            stdout=out, stderr=subprocess.STDOUT, env=env)


def rows(run_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def logged_steps(run_dir: Path) -> int:
    """Steps in metrics.jsonl (the step-0 row excluded); a torn last line is not a step."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    count = 0
    for line in path.read_text().splitlines():
        try:
            count += json.loads(line)["step"] > 0
        except (ValueError, KeyError, TypeError):
            pass
    return count


def checkpoints(run_dir: Path, since: float) -> tuple[list[str], bool]:
    """(committed checkpoints, whether one is being written now: a temporary directory made after
    `since`, the launch; one a killed writer left behind is not)."""
    folder = run_dir / "checkpoints"
    names = sorted(p.name for p in folder.iterdir()) if folder.exists() else []

    def fresh(name: str) -> bool:
        try:
            return (folder / name).stat().st_mtime >= since
        except FileNotFoundError:
            return False
    return [n for n in names if n.startswith("step-")], any(n.endswith(".tmp") and fresh(n) for n in names)


def wait_for_kill(kind: str, run_dir: Path, proc: subprocess.Popen, rng: random.Random, launched: float) -> None:
    """Sleep until the moment `kind` draws (returns early when the run ends)."""
    if kind == "start-up":
        time.sleep(rng.uniform(2.0, 20.0))
        return
    at_launch = logged_steps(run_dir)
    while proc.poll() is None:
        if kind == "mid-checkpoint" and checkpoints(run_dir, launched)[1]:
            time.sleep(rng.uniform(0.0, 0.5))
            return
        if kind == "mid-step" and logged_steps(run_dir) > at_launch:
            time.sleep(rng.uniform(0.0, 30.0))  # a step takes 15-50 s here
            return
        time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cores", default="0,1", help="the unbroken run's core, the killed run's")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ref_core, kill_core = (int(c) for c in args.cores.split(","))
    reference, broken = args.out / "unbroken", args.out / "killed"
    started = time.time()
    ref = launch(ref_core, *ARGS, "--run-dir", str(reference), log=args.out / "unbroken.log")
    rng = random.Random(args.seed)
    kills, moments = 0, []
    proc = launch(kill_core, *ARGS, "--run-dir", str(broken), log=args.out / "killed.log")
    launched = time.time()
    while kills < args.kills:
        kind = rng.choices(["start-up", "mid-step", "mid-checkpoint"], weights=[1, 2, 2])[0]
        wait_for_kill(kind, broken, proc, rng, launched)
        if proc.poll() is not None:
            break
        committed, writing = checkpoints(broken, launched)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        moments.append({"kind": kind, "after_s": round(time.time() - launched, 1),
                        "steps_logged": logged_steps(broken), "latest_checkpoint": committed[-1] if committed else None,
                        "checkpoint_being_written": writing})
        if (broken / "config.yaml").exists():
            proc = launch(kill_core, "--resume", str(broken), log=args.out / "killed.log")
        else:  # killed before the run directory existed: start it again
            proc = launch(kill_core, *ARGS, "--run-dir", str(broken), log=args.out / "killed.log")
        launched = time.time()
    rc, ref_rc = proc.wait(), ref.wait()
    a, b = rows(reference), rows(broken)
    same = [tuple(r.get(k) for k in COMPARED) for r in a] == [tuple(r.get(k) for k in COMPARED) for r in b]
    sample_steps = [s["step"] for s in rows(broken, "samples.jsonl")]
    checks = {
        "exit codes 0": rc == 0 and ref_rc == 0,
        "every step once": [r["step"] for r in b] == list(range(STEPS + 1)),
        "every sample once": sample_steps == [s for s in range(1, STEPS + 1) for _ in range(4 * 8)],
        "metrics equal the unbroken run's": same,
        "DONE written": (broken / "DONE").exists(),
    }
    evals = {name: [(r["step"], r["eval_pass_rate"]) for r in rs if r.get("eval_pass_rate") is not None]
             for name, rs in (("unbroken", a), ("killed", b))}
    checks["a kill mid-checkpoint and one after a checkpoint"] = (
        any(m["checkpoint_being_written"] for m in moments) and any(m["latest_checkpoint"] for m in moments))
    print(json.dumps({"kills": kills, "moments": moments, "checks": checks, "eval_pass_rate": evals,
                      "wall_s": round(time.time() - started, 1)}))
    return 0 if all(checks.values()) and kills == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
