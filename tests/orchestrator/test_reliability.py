"""Reliability: every bad input is one clear line (exit code 2, no traceback), faults never lose
work or hang, and long runs stay deterministic and bounded."""
from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from aioareal import checkpoint
from aioareal.cli import main
from aioareal.config import load_config
from aioareal.errors import UserError
from aioareal.group import Example
from aioareal.rewards.service import RewardService
from aioareal.run.events import DUPLICATE_S
from aioareal.run.recipe import train

QUIET = dict(log=lambda *_: None, printer=lambda row: None)


@pytest.fixture(scope="module")
def no_template_model(tmp_path_factory) -> Path:
    """A local model whose tokenizer has no chat template."""
    from aioareal.models import random_model
    from aioareal.models.shapes import build_char_tokenizer

    path = tmp_path_factory.mktemp("plain-model")
    random_model("tiny", torch.float32, torch.device("cpu")).save_pretrained(path)
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    config = load_config(overrides=["model.name=random:tiny", "train.steps=1", "algo.batch_groups=2", "eval.every=0",
                                    "data.eval_size=4"], flags={"run.run_dir": str(run_dir)})
    train(config, **QUIET)
    return run_dir


def catalogue(tmp: Path, no_template: Path, finished: Path) -> list[tuple[list[str], str]]:
    empty, bad, qa = tmp / "empty.jsonl", tmp / "bad.jsonl", tmp / "qa.jsonl"
    empty.write_text("")
    bad.write_text('{"question": "1+1=", "answer": "2"}\n{"question": "2+2=", "answer": "4"\n')
    qa.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(30)))
    (tmp / "not-a-run").mkdir(exist_ok=True)
    file_task = ["model.name=random:tiny", "data.task=file", "data.eval_size=5"]
    return [
        (["algo.lrr=1"], "config key 'algo.lrr': unknown key; did you mean 'algo.lr'?"),
        (["algo.lr=fast"], "config key 'algo.lr': expected a number, got 'fast'"),
        (["--mode", "async", "--max-staleness", "-1"], "config key 'rollout.max_staleness': must be >= 0, got -1"),
        (["algo.batch_groups=6", "algo.minibatches=4"], "config key 'algo.minibatches': must divide"),
        (["--mode", "one-step", "--max-staleness", "0"], "one-step mode overlaps exactly one batch (K=1), got 0"),
        (["--objective", "decoupled", "algo.prox=none"], "expected one of recompute | loglinear, got 'none'"),
        (["model.name=./missing/model"], "model.name './missing/model': no such file or directory"),
        ([f"model.name={no_template}", "data.task=file", f"data.path={qa}", "data.eval_size=5"],
         "data.chat_template is true but the tokenizer has no chat template"),
        ([*file_task, f"data.path={tmp / 'nope.jsonl'}"], "nope.jsonl: no such file"),
        ([*file_task, f"data.path={empty}"], "empty.jsonl: "),
        ([*file_task, f"data.path={bad}"], "bad.jsonl:2: malformed JSON line"),
        ([*file_task, f"data.path={qa}", "data.prompt_template={question}", "data.max_prompt_tokens=3"],
         "has 4 tokens, more than data.max_prompt_tokens=3"),
        (["--resume", str(tmp / "not-a-run")], "not a run directory (no config.yaml inside)"),
        (["--resume", str(finished), "algo.lr=0.5"], "differs from the run's in algo.lr; pass --force"),
        (["--run-dir", str(finished)], "already holds a run; continue it with --resume"),
    ]


def test_bad_input_catalogue(tmp_path, capsys, no_template_model, finished_run):
    for args, expected in catalogue(tmp_path, no_template_model, finished_run):
        run_args = args if any(a.startswith("--r") for a in args) else [*args, "--run-dir", str(tmp_path / "r")]
        code = main([*run_args, "--no-dashboard", "--steps", "1"])
        err = capsys.readouterr().err.strip()
        assert code == 2, (args, err)
        assert err.startswith("error: ") and expected in err, (args, err)
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_skip_bad_rows_skips_and_counts(tmp_path, capsys):
    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\nnot json\n{"question": "2+2="}\n'
                    + "".join(json.dumps({"question": f"{i}+2=", "answer": str(i + 2)}) + "\n" for i in range(20)))
    code = main(["model.name=random:tiny", "data.task=file", f"data.path={data}", "data.eval_size=4",
                 "data.prompt_template={question}", "data.skip_bad_rows=true", "--steps", "1", "algo.batch_groups=2",
                 "--no-dashboard", "--run-dir", str(tmp_path / "run")])
    assert code == 0
    assert "skipped 2 malformed rows" in capsys.readouterr().out


def test_non_finite_updates_are_skipped_counted_then_stop_the_run(tmp_path, monkeypatch, capsys):
    import aioareal.trainer.trainer as trainer_module

    real, calls = trainer_module.micro_loss, {"n": 0}

    def poisoned(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] in (2, *range(4, 100)) else loss), stats

    monkeypatch.setattr(trainer_module, "micro_loss", poisoned)
    run_dir = tmp_path / "run"
    code = main(["model.name=random:tiny", "--steps", "20", "algo.batch_groups=2", "eval.every=0",
                 "run.checkpoint_every=1", "--no-dashboard", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 3 and "5 consecutive updates had a non-finite loss or gradient" in err
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[2]["skipped_updates"] == 1 and rows[3]["skipped_updates"] == 1  # skipped once, then went on
    latest = checkpoint.latest_checkpoint(run_dir)
    assert checkpoint.load_state(latest).step == rows[-1]["step"]  # the last good step is kept
    assert checkpoint.load_state(latest).step < 20


def test_out_of_memory_halves_the_micro_batch_and_retries(tmp_path, monkeypatch):
    import aioareal.trainer.logprobs as logprobs_module
    import aioareal.trainer.trainer as trainer_module

    real = logprobs_module.token_logprobs
    rows_tried: list[int] = []

    def picky(model, input_ids, *args, **kwargs):
        rows_tried.append(input_ids.shape[0])
        if input_ids.shape[0] > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, input_ids, *args, **kwargs)

    # The policy's forward (logprobs.Policy) and the reference model's path (trainer) both call it.
    monkeypatch.setattr(logprobs_module, "token_logprobs", picky)
    monkeypatch.setattr(trainer_module, "token_logprobs", picky)
    # A random model's rewards are all zero: every row is computed only when none is set aside.
    config = load_config(overrides=["model.name=random:tiny", "train.steps=2", "algo.batch_groups=2", "eval.every=0",
                                    "train.skip_zero_advantage=false"], flags={"run.run_dir": str(tmp_path / "run")})
    train(config, **QUIET)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # Each step: its 16 rows fail as 16, 8 and 4, then run as eight micro-batches of 2 (every row
    # trained once); the retries are counted, cumulatively.
    assert rows_tried == 2 * ([16, 8, 4] + [2] * 8)
    assert [r["oom_retries"] for r in rows[1:]] == [3, 6] and all(math.isfinite(r["loss"]) for r in rows[1:])


def test_reward_faults_score_zero_and_are_counted():
    release, hang_returned = threading.Event(), threading.Event()

    def scorer(texts, examples):
        mode = examples[0].answer
        if mode == "hang":
            release.wait(60)
            hang_returned.set()
        if mode == "raise":
            raise ValueError("verifier bug")
        if mode == "garbage":
            return ["yes", float("nan"), None, 1.0]
        if mode == "short":
            return [1.0]
        return [1.0] * len(texts)

    service = RewardService(scorer, decode=lambda ids: "x", workers=8, timeout_s=0.3)

    async def go():
        ex = lambda mode: [Example("u", "q", mode)] * 4  # noqa: E731
        return await asyncio.gather(*(service.score([[1]] * 4, ex(m)) for m in
                                      ("ok", "hang", "raise", "garbage", "short")))

    try:
        results = asyncio.run(go())
        assert not hang_returned.is_set()  # every call came back while the hung verifier still hung
    finally:
        release.set()
    assert results[0] == ([1.0] * 4, 0)
    assert results[1] == ([0.0] * 4, 4) and results[2] == ([0.0] * 4, 4)
    assert results[3] == ([0.0, 0.0, 0.0, 1.0], 3) and results[4] == ([0.0] * 4, 4)
    assert service.stats.timeouts == 1 and service.stats.failures == 15
    # raise, wrong length: one failed check each; garbage: three bad entries
    assert service.stats.metrics() == {"reward_timeouts": 1, "reward_errors": 5}
    service.close()


def test_a_run_goes_on_through_failing_rewards(tmp_path, monkeypatch):
    module = tmp_path / "flaky_rewards.py"
    module.write_text("import random\n"
                      "def flaky(completions, **kw):\n"
                      "    if random.random() < 0.3:\n"
                      "        raise RuntimeError('flaky verifier')\n"
                      "    return [float(len(c) > 1) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config(overrides=["model.name=random:tiny", "train.steps=6", "algo.batch_groups=4", "eval.every=0",
                                    "reward.functions=flaky_rewards:flaky"],
                         flags={"run.run_dir": str(tmp_path / "run")})
    train(config, **QUIET)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 6 and rows[-1]["reward_failures"] > 0
    assert rows[-1]["reward_errors"] > 0 and rows[-1]["reward_timeouts"] == 0  # the service's counts reach the row


def test_second_ctrl_c_exits_at_once(tmp_path, tiny_model_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Big batches make each step take a while (0.8 s on a fast 2-core machine, seconds on others),
    # and the second Ctrl-C follows the first one's notice by just over events.DUPLICATE_S (a
    # sooner one counts as the same signal delivered twice), so it lands inside the step the first
    # one asked to finish.
    proc = subprocess.Popen([sys.executable, "-m", "aioareal", "--steps", "400", "--no-dashboard", "--run-dir",
                             str(tmp_path / "run"), "algo.batch_groups=256"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:
        if line.split("/")[0].split() == ["step", "1"]:  # "step   1/400 | ..."
            break
    proc.send_signal(signal.SIGINT)
    noticed = False
    for line in proc.stderr:  # the first Ctrl-C was seen: the run is finishing its step
        if "finishing the current step" in line:
            noticed = True
            break
    time.sleep(DUPLICATE_S + 0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130  # a hang guard, not a speed bound
    err = proc.stderr.read()
    assert noticed and "exiting now" in err
    # At once: the step the first Ctrl-C asked to finish never reached the metrics.
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) == 1, [r["step"] for r in rows]


def test_same_seed_same_metrics_in_sync_mode(tmp_path):
    def run(name):
        config = load_config(overrides=["model.name=random:tiny", "train.steps=4", "algo.batch_groups=4",
                                        "eval.every=2", "data.eval_size=20"],
                             flags={"run.run_dir": str(tmp_path / name)})
        train(config, **QUIET)
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        keep = ("reward_mean", "loss", "grad_norm", "entropy", "eval_pass_rate", "response_len_mean")
        return [{k: r.get(k) for k in keep} for r in rows]

    assert run("a") == run("b")


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_memory_does_not_grow_over_hundreds_of_steps(tmp_path):
    rss: dict[int, float] = {}

    def record(row):
        if row["step"] in (50, 300):
            rss[row["step"]] = _rss_mb()

    config = load_config(overrides=["model.name=random:tiny", "train.steps=300", "algo.batch_groups=2",
                                    "algo.group_size=2", "generation.max_new_tokens=4", "eval.every=0",
                                    "data.eval_size=4", "run.checkpoint_every=100", "run.keep_checkpoints=1"],
                         flags={"run.run_dir": str(tmp_path / "run")}, )
    train(config, log=lambda *_: None, printer=record)
    assert rss[300] - rss[50] < 25, rss  # MB over 250 steps: no per-step leak
    assert len(checkpoint.list_checkpoints(tmp_path / "run")) == 1


def test_async_with_k0_reproduces_sync_on_the_real_model(tmp_path):
    def run(name, mode):
        config = load_config(overrides=["model.name=random:tiny", "train.steps=3", "algo.batch_groups=4",
                                        "eval.every=3", "data.eval_size=20"],
                             flags={"run.run_dir": str(tmp_path / name), "rollout.mode": mode,
                                    "rollout.max_staleness": 0})
        train(config, **QUIET)
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [(r.get("reward_mean"), r.get("loss"), r.get("staleness_max"), r.get("eval_pass_rate")) for r in rows]

    assert run("sync", "sync") == run("async", "async")


def test_checkpoint_keeps_the_rng_state_of_the_step_end_even_if_the_generator_runs_meanwhile(monkeypatch):
    """A stop checkpoint is written on the trainer's thread while the generator may already sample
    the next batch: the saved sampling state must be the one at the end of the step, or a resumed
    run samples differently from an unbroken one."""
    from types import SimpleNamespace

    from aioareal.run.events import checkpoint_saver

    generator = torch.Generator().manual_seed(3)
    at_step_end = generator.get_state()
    saved = {}
    monkeypatch.setattr(checkpoint, "save", lambda *args: saved.setdefault("rng", args[5]))

    async def call(fn):  # the trainer thread runs the write after the generator drew numbers
        torch.rand(4, generator=generator)
        fn()

    trainer = SimpleNamespace(trainer=SimpleNamespace(model=None, state_dict=dict), call=call)
    save = checkpoint_saver(None, trainer, generator, tokenizer=None, keep=2)
    asyncio.run(save(checkpoint.RunState(step=3, cursor=0, elapsed=1.0)))
    assert torch.equal(saved["rng"]["engine"], at_step_end)


def test_hung_verifiers_do_not_starve_later_groups():
    """Two workers, three verifier calls that hang: with a thread pool the hung calls would hold
    both workers and every later group would time out and score 0."""
    release = threading.Event()

    def scorer(texts, examples):
        if examples[0].answer == "hang":
            release.wait(10)
        return [1.0] * len(texts)

    service = RewardService(scorer, decode=lambda ids: "x", workers=2, timeout_s=0.2)

    async def go():
        ex = lambda mode: [Example("u", "q", mode)] * 2  # noqa: E731
        hung = await asyncio.gather(*(service.score([[1]] * 2, ex("hang")) for _ in range(3)))
        later = await asyncio.gather(*(service.score([[1]] * 2, ex("ok")) for _ in range(4)))
        return hung, later

    try:
        hung, later = asyncio.run(go())
        assert hung == [([0.0, 0.0], 2)] * 3
        assert later == [([1.0, 1.0], 0)] * 4
        assert service.stats.timeouts == 3 and service.stats.hung == 3
    finally:
        release.set()


def test_a_detokenizer_error_scores_zero_instead_of_failing_the_group():
    def decode(ids):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad byte")

    service = RewardService(lambda texts, examples: [1.0] * len(texts), decode=decode)
    assert asyncio.run(service.score([[1], [2]], [Example("u", "q", "a")] * 2)) == ([0.0, 0.0], 2)


def test_resume_skips_an_unreadable_checkpoint_for_the_one_before_it(tmp_path):
    from aioareal.run.recipe import resume

    run_dir = tmp_path / "run"
    config = load_config(overrides=["model.name=random:tiny", "train.steps=3", "algo.batch_groups=2", "eval.every=0",
                                    "data.eval_size=8", "run.checkpoint_every=1", "run.keep_checkpoints=3"],
                         flags={"run.run_dir": str(run_dir)})
    train(config, **QUIET)
    newest = checkpoint.latest_checkpoint(run_dir)
    weights = newest / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a disk fault after the rename
    (run_dir / "DONE").unlink()
    lines = []
    resume(run_dir, log=lines.append, printer=lambda row: None)
    assert any("is unreadable" in line and newest.name in line for line in lines)
    assert (newest.parent / f"broken-{newest.name}").is_dir()  # kept for inspection, no longer a checkpoint
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 3 redone from step 2's checkpoint, once
    assert (run_dir / "DONE").exists()
    for path in checkpoint.list_checkpoints(run_dir):
        checkpoint.check_readable(path)
    for path in checkpoint.list_checkpoints(run_dir):  # every checkpoint broken: refuse, change nothing
        (path / "trainer.pt").write_bytes(b"garbage")
    (run_dir / "DONE").unlink()
    for _ in range(2):  # and again: the broken ones moved aside, it must still not start over
        with pytest.raises(UserError, match="no checkpoint .* reads back"):
            resume(run_dir, log=lambda *_: None, printer=lambda row: None)
        assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 4


def test_a_verifier_that_hangs_for_good_ends_the_run_instead_of_piling_up_threads(monkeypatch):
    import aioareal.rewards.service as rewards_module

    monkeypatch.setattr(rewards_module, "MAX_HUNG", 3)
    release = threading.Event()

    def scorer(texts, examples):
        release.wait(10)
        return [1.0] * len(texts)

    service = RewardService(scorer, decode=lambda ids: "x", workers=2, timeout_s=0.05)

    async def go():
        for _ in range(3):  # each times out and scores 0: the run goes on
            assert await service.score([[1]], [Example("u", "q", "a")]) == ([0.0], 1)
        await service.score([[1]], [Example("u", "q", "a")])

    try:
        with pytest.raises(UserError, match="3 reward verifier calls are still running"):
            asyncio.run(go())
    finally:
        release.set()
