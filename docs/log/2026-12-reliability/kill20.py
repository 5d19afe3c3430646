"""Issue 49, item 8: a SmolLM2-135M-Instruct run SIGKILLed at 20 random moments and resumed each time,
against the same run never interrupted. Run from the repository root:

    python docs/log/2026-12-reliability/kill20.py OUT_DIR [--kills 20] [--seed 7]

Both runs start at once, each on a core of its own (taskset). The interrupted one is killed at random
moments (start-up, mid-step, mid-checkpoint: anywhere) and resumed with `--resume`; in sync mode on the
CPU a resumed run replays exactly, so every logged figure must equal the unbroken run's. Prints one JSON
line with the comparison; exit status 0 when every check holds.
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

STEPS = 8
ARGS = ["--config", "configs/smollm2-sums.yaml", "--no-dashboard", "--steps", str(STEPS),
        "model.dtype=float32", "model.train_dtype=float32", "train.optimizer_moments=float32",
        "algo.batch_groups=4", "generation.max_new_tokens=32", "eval.every=4", "data.eval_size=50",
        "run.checkpoint_every=1", "run.keep_checkpoints=2"]
COMPARED = ("step", "version", "reward_mean", "loss", "grad_norm", "entropy", "eval_pass_rate", "groups_trained")


def launch(core: int, *args: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    out = open(log, "a")  # noqa: SIM115 -- the child writes it; closed with the process
    return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-m", "aioareal", *args],
                            stdout=out, stderr=subprocess.STDOUT, env=env)


def rows(run_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    reference, broken = args.out / "unbroken", args.out / "killed"
    started = time.time()
    ref = launch(0, *ARGS, "--run-dir", str(reference), log=args.out / "unbroken.log")
    rng = random.Random(args.seed)
    kills, moments = 0, []
    proc = launch(1, *ARGS, "--run-dir", str(broken), log=args.out / "killed.log")
    while kills < args.kills:
        wait = rng.uniform(10.0, 110.0)  # start-up takes 20-60 s here, a step 15-50 s
        time.sleep(wait)
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        done = len(rows(broken)) - 1 if (broken / "metrics.jsonl").exists() else -1
        moments.append({"after_s": round(wait, 1), "last_step_logged": done})
        if (broken / "config.yaml").exists():
            proc = launch(1, "--resume", str(broken), log=args.out / "killed.log")
        else:  # killed before the run directory existed: start it again
            proc = launch(1, *ARGS, "--run-dir", str(broken), log=args.out / "killed.log")
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
    print(json.dumps({"kills": kills, "moments": moments, "checks": checks, "eval_pass_rate": evals,
                      "wall_s": round(time.time() - started, 1)}))
    return 0 if all(checks.values()) and kills == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
