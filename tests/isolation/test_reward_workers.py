"""Verifiers a timeout can stop: the worker pool kills and replaces overrunning workers, the reward
service returns every call, even one whose verifier never ends, while the event loop keeps ticking, every
failure is counted, and no worker outlives its interpreter."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import bench_schema
import gsm8k_data
import pytest
from loop_gaps import with_longest_gap

from aioareal.cli import main
from aioareal.config import load_config
from aioareal.grading.verify import SYMBOLIC_PRELOAD, grade
from aioareal.group import Example
from aioareal.isolation.pool import WorkerPool
from aioareal.rewards import build_scorer
from aioareal.rewards.reward_functions import ProcessRewards
from aioareal.rewards.service import GradedScorer, RewardService
from aioareal.run.build import task_from

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def pool():
    pool = WorkerPool(2, preload=(SYMBOLIC_PRELOAD,))
    assert pool.wait_ready(60)
    yield pool
    pids = pool.pids()
    pool.close()
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_job_past_its_time_is_killed_and_the_worker_replaced(pool: WorkerPool) -> None:
    assert pool.run("operator:add", (1, 2), 5.0).value == 3
    before = pool.pids()
    outcome = pool.run("time:sleep", (60,), 0.3)  # a timeout waited out would read "ok", a minute later
    assert outcome.status == "timeout"
    assert pool.restarts == 1 and pool.pids() != before
    assert not any(_alive(pid) for pid in set(before) - set(pool.pids()))  # the overrunning worker is gone
    assert pool.run("operator:mul", (6, 7), 5.0).value == 42  # the replacement takes jobs


def test_a_crashed_worker_is_an_error_and_is_replaced(pool: WorkerPool) -> None:
    outcome = pool.run("os:_exit", (3,), 5.0)
    assert outcome.status == "error" and "exit code 3" in outcome.message
    assert pool.run("math:factorial", (-1,), 5.0).message.startswith("ValueError")  # raised in the job
    assert pool.run("operator:add", (2, 2), 5.0).value == 4


def test_a_job_cancelled_while_queued_is_skipped(pool: WorkerPool) -> None:
    running = [pool.submit("time:sleep", (0.3,), 5.0) for _ in range(2)]  # both workers busy
    dropped, kept = pool.submit("operator:add", (1, 1), 5.0), pool.submit("operator:add", (2, 2), 5.0)
    assert dropped.cancel()
    assert kept.result(timeout=10).value == 4 and all(f.result(timeout=10).ok for f in running)


def test_workers_import_neither_torch_nor_transformers(pool: WorkerPool) -> None:
    assert "torch" in sys.modules  # the parent has it (conftest)
    for module in ("torch", "transformers", "aioareal.rewards.service"):
        assert pool.run("sys:modules.__contains__", (module,), 5.0).value is False, module
    assert pool.run("sys:modules.__contains__", ("sympy",), 5.0).value is True  # preloaded


def test_no_worker_outlives_its_interpreter() -> None:
    script = ("from aioareal.isolation.pool import WorkerPool\n"
              "p = WorkerPool(2); assert p.wait_ready(60); print(*p.pids(), flush=True)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    pids = [int(x) for x in out.stdout.split()]
    assert len(pids) == 2 and not any(_alive(p) for p in pids)
    # A parent killed outright: its workers see their pipe close and exit on their own.
    proc = subprocess.Popen([sys.executable, "-c", script + "import time; time.sleep(60)\n"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in proc.stdout.readline().split()]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _pathological() -> dict[str, str]:
    return {
        "huge power": "The answer is \\boxed{9^{9^{9}}}.",
        "big power": "\\boxed{10^{10^{7}}}",
        "200k characters": "Let me think. " + "1 2 " * 50_000,
        "nested braces": "\\boxed{" + "{" * 5000 + "19" + "}" * 5000 + "}",
        "unclosed boxes": "\\boxed{" * 8000,
        "past the digit limit": "\\boxed{" + "9" * 5000 + "}",
    }


def test_pathological_completions_return_in_time_while_the_loop_ticks(pool: WorkerPool) -> None:
    timeout = 2.0
    texts = list(_pathological().values()) + ["So she makes \\boxed{18}."]
    scorer = GradedScorer(lambda text, example: grade(example.answer, text), (SYMBOLIC_PRELOAD,))
    service = RewardService(scorer, decode=lambda ids: texts[ids[0]], workers=2, timeout_s=timeout, pool=pool)
    good = len(texts) - 1

    async def call(i: int) -> tuple[list[float], int]:
        return await service.score([[i], [good]], [Example(str(i), "q", "#### 18")] * 2)

    async def go() -> tuple[list, float]:
        return await with_longest_gap(asyncio.gather(*(call(i) for i in range(good))))

    # "huge power" never ends on its own: every call returning at all is the deadline at work.
    results, worst_gap = asyncio.run(go())
    for name, (scores, _) in zip(_pathological(), results):
        assert scores == [0.0, 1.0], name  # the group's good completion still counts
    # The event loop kept ticking: a sympy call in-process would freeze it for longer than the
    # timeout (the checks that time out run past it), so a gap of the whole timeout is a freeze;
    # anything shorter is a busy machine, whose 2 cores are shared with other jobs.
    assert worst_gap < timeout, worst_gap
    s = service.stats
    assert s.timeouts >= 1 and s.errors >= 1 and s.failures == s.timeouts + s.errors
    assert s.metrics() == {"reward_timeouts": s.timeouts, "reward_errors": s.errors}
    assert pool.restarts >= 1
    assert asyncio.run(service.score([[good]], [Example("x", "q", "18")])) == ([1.0], 0)  # and it goes on


def test_user_reward_functions_in_processes_are_killed_on_timeout(tmp_path: Path) -> None:
    module = tmp_path / "spin_rewards.py"
    module.write_text("def spin(completions, answer, **kwargs):\n"
                      "    if completions[0] == 'spin':\n"
                      "        while True:\n"
                      "            pass\n"
                      "    return [float(c == a) for c, a in zip(completions, answer)]\n")
    config = load_config(overrides=[f"reward.functions={module}:spin", "reward.isolation=process",
                                    "reward.timeout_s=1", "reward.workers=1"])
    scorer = build_scorer(config.reward, task_from(config))
    assert isinstance(scorer, ProcessRewards)
    pool = WorkerPool(1)
    try:
        assert pool.wait_ready(60)  # the job starts in a worker, rather than expiring in the queue
        service = RewardService(scorer, decode=lambda ids: ["spin", "7", "8"][ids[0]], workers=1, timeout_s=1.0,
                                pool=pool)
        examples = [Example("u", "q", "7", {"answer": "7"})] * 2
        # The spinning reward never returns: the call coming back, with a timeout counted, is the kill.
        assert asyncio.run(service.score([[0], [1]], examples)) == ([0.0, 0.0], 2)
        assert service.stats.timeouts == 1 and service.stats.hung == 0
        # The pool kills the spinning worker at its own deadline, which may come just after the call
        # returned (busy cores): wait for that kill, then for its replacement.
        end = time.monotonic() + 60
        while pool.restarts == 0 and time.monotonic() < end:
            time.sleep(0.05)
        assert pool.restarts == 1 and pool.wait_ready(60)
        assert asyncio.run(service.score([[1], [2]], examples)) == ([1.0, 0.0], 0)
    finally:
        pool.close()


def test_bench_reward_reports_throughput_and_agreement(capsys, tmp_path: Path) -> None:
    out = tmp_path / "bench.jsonl"
    assert main(["bench", "reward", "--data", str(gsm8k_data.SLICE / "train.jsonl"), "--completions", "64",
                 "--repeats", "1", "--workers", "1", "--chunk", "16", "--out", str(out)]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures == json.loads(out.read_text().splitlines()[-1])
    bench_schema.check(figures, bench_schema.REWARD, bench_schema.REWARD_AGREEMENT)
    assert figures["completions"] == 64 and figures["workers"] == 1 and figures["cases"] >= 150
    assert figures["agree_ours"] == 1.0 and figures["false_pass_ours"] == figures["false_fail_ours"] == 0
    assert figures["real_agree_ours"] == 1.0 and figures["real_rows"] >= 160
    assert max(figures[f"agree_{b}"] for b in ("math_verify", "strict_regex", "flexible_regex")) < 1.0


def test_bench_reward_without_grading_cases_times_and_skips_agreement(capsys, monkeypatch, tmp_path: Path) -> None:
    """An installed wheel ships no grading data: the speed figures run, agreement is skipped with a note."""
    import aioareal.lab.bench.cases

    monkeypatch.setattr(aioareal.lab.bench.cases, "REPOSITORY_DIR", tmp_path / "site-packages" / "tests" / "data")
    assert main(["bench", "reward", "--data", str(gsm8k_data.SLICE / "train.jsonl"), "--completions", "16",
                 "--repeats", "1", "--workers", "1", "--chunk", "8"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "agreement figures skipped" in lines[0] and "--cases DIR" in lines[0]
    figures = json.loads(lines[-1])
    bench_schema.check(figures, bench_schema.REWARD)
    assert figures["completions"] == 16 and "cases" not in figures and "real_rows" not in figures


HANGS_WITH_A_CHILD = """\
import subprocess, time
def spawn_and_hang(path):
    child = subprocess.Popen(["sleep", "60"])
    with open(path, "w") as f:
        f.write(str(child.pid))
    time.sleep(60)
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed child whose reaper has not come yet is dead for this purpose)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def test_a_jobs_own_child_processes_die_with_it_at_the_deadline(tmp_path, monkeypatch) -> None:
    (tmp_path / "hangs_with_a_child.py").write_text(HANGS_WITH_A_CHILD)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned workers take the parent's sys.path
    pool = WorkerPool(1)
    try:
        assert pool.wait_ready(60)
        pid_file = tmp_path / "child.pid"
        outcome = pool.run("hangs_with_a_child:spawn_and_hang", (str(pid_file),), 2.0)
        assert outcome.status == "timeout" and pid_file.is_file()
        child = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child)  # killed with its worker's process group, not left running
        assert pool.run("operator:add", (1, 2), 5.0).value == 3
    finally:
        pool.close()
