"""The Python API (aioareal/api): a run trained from objects (rows, a lambda reward), stopped by a
callback or an interrupt inside a running event loop, resumed with no step lost or repeated, read
back as DataFrames, evaluated and talked to; bad objects are one-line errors."""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal

import numpy as np
import pandas as pd
import pytest

import aioareal
from aioareal.api.data import plain_row
from aioareal.errors import DataError, UserError

STEPS = 6
# data.eval_size stays at its default: the tiny warm-start's cache key holds it, and the suite's
# warm-start (tiny_model_path) is trained with the defaults; another size would train a second one.
KEYS = {"data": {"chat_template": False, "prompt_template": "{question}"},
        "eval": {"every": 3}, "algo": {"batch_groups": 4, "group_size": 4}}


def sums(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    pairs = [(rng.randint(1, 30), rng.randint(1, 30)) for _ in range(n)]
    return [{"question": f"{a}+{b}=", "answer": str(a + b), "a": a} for a, b in pairs]


def exact(completions, answer, **kwargs):
    return [float(c.strip().split()[:1] == [a]) for c, a in zip(completions, answer)]


def train(tmp_path, **kw):
    options = {"model": "tiny", "train_dataset": sums(600), "steps": STEPS, "run_dir": tmp_path / "run",
               "progress": "off", **KEYS}
    options.update(kw)
    return aioareal.train(**options)


def steps_of(run) -> list[int]:
    return [json.loads(line)["step"] for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_lambda_reward_stopped_by_a_callback_resumes_without_losing_or_repeating_a_step(tmp_path, tiny_model_path):
    columns: list[list[int]] = []

    def uses_a_column(completions, a, **kwargs):  # a closure over `columns`: the dataset's own column arrives
        columns.append(a)
        return [0.0] * len(completions)

    funcs = [exact, lambda completions, **kw: [0.1] * len(completions), uses_a_column]
    run = train(tmp_path, reward_funcs=funcs, on_step=lambda row: row["step"] >= 2)
    assert run.stopped and run.step == 2 and run.policy_path is not None and run.policy_path.is_dir()
    assert run.config.reward.functions == ["python:exact", "python:reward_1", "python:uses_a_column"]
    assert (run.run_dir / "data" / "train.jsonl").is_file() and columns and all(isinstance(v, int) for v in columns[0])
    done = aioareal.train(resume=run, reward_funcs=funcs, progress="off")
    assert not done.stopped and done.run_dir == run.run_dir
    assert steps_of(done) == list(range(STEPS + 1))
    metrics = done.metrics
    assert isinstance(metrics, pd.DataFrame) and list(metrics["step"]) == list(range(STEPS + 1))
    assert metrics["reward_mean"].iloc[1:].min() >= 0.1  # the lambda's 0.1 is in every reward
    assert metrics["eval_pass_rate"].notna().sum() == 3  # steps 0, 3, 6
    assert len(done.samples) and {"text", "reward"} <= set(done.samples.columns)
    assert len(done.eval_samples)


def test_inside_a_running_event_loop_an_interrupt_stops_after_the_step_with_a_checkpoint(tmp_path, tiny_model_path):
    def interrupt_at_two(row):
        if row["step"] == 2:
            os.kill(os.getpid(), signal.SIGINT)  # what a notebook's interrupt button sends

    async def cell():  # a notebook cell: a loop runs on this thread while the cell's code runs
        return train(tmp_path, reward_funcs=exact, on_step=interrupt_at_two)

    run = asyncio.run(cell())
    assert run.stopped and 2 <= run.step < STEPS and run.policy_path is not None
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back
    done = asyncio.run(asyncio.to_thread(aioareal.train, resume=run.run_dir, reward_funcs=exact, progress="off"))
    assert steps_of(done) == list(range(STEPS + 1))


def test_a_dataframe_and_a_dataset_train_and_the_run_evaluates_and_chats(tmp_path, tiny_model_path):
    datasets = pytest.importorskip("datasets")
    frame = pd.DataFrame(sums(600))
    held_out = datasets.Dataset.from_list(sums(40, seed=1))
    run = train(tmp_path, train_dataset=frame, eval_dataset=held_out, reward_funcs=[exact], steps=2,
                learning_rate=3e-4, num_generations=4)
    assert run.config.algo.lr == 3e-4 and run.config.data.eval_path.endswith("eval.jsonl")
    figures = run.evaluate("tiny", out=tmp_path / "eval", settings={"data.eval_size": 16})
    assert [t["target"] for t in figures["targets"]][-1] == str(run.run_dir)
    assert all(0.0 <= t["pass@1_greedy"] <= 1.0 and t["prompts"] == 16 for t in figures["targets"])
    reply = run.chat("12+7=", max_new_tokens=8, stream=False)
    assert isinstance(reply, str) and run.generate(["1+1=", "2+2="], max_new_tokens=4) == [
        run.generate(["1+1="], max_new_tokens=4)[0], run.generate(["2+2="], max_new_tokens=4)[0]]


def test_rows_become_json_values_or_an_error_naming_row_and_column():
    row = plain_row({"n": np.int64(3), "x": np.float32(0.5), "v": np.arange(2), "gone": float("nan")}, "train row 0")
    assert row == {"n": 3, "x": 0.5, "v": [0, 1], "gone": None}
    with pytest.raises(DataError, match="train row 4, column 'blob': a bytes value"):
        plain_row({"blob": b"\x00"}, "train row 4")


@pytest.mark.parametrize("kw, message", [
    ({"train_dataset": {"question": "1+1="}}, "train_dataset: a dict, expected a datasets.Dataset"),
    ({"train_dataset": [1, 2]}, "train_dataset row 0: a int, expected a dict of columns"),
    ({"train_dataset": []}, "train_dataset: no rows"),
    ({"reward_funcs": [3]}, r"reward_funcs\[0\] is a int"),
    ({"reward_funcs": [exact], "reward": {"isolation": "process"}}, "worker process .* cannot import"),
    ({"warp": 9}, "keyword 'warp' is neither a config section"),
    ({"settings": {"lr": 1}}, "settings: key 'lr' is not 'section.key'"),
    ({"settings": {"algo.beta": 0.1}}, "TRL's beta is algo.kl_coef"),
    ({"progress": "bar"}, "progress='bar'"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, kw, message):
    with pytest.raises(UserError, match=message):
        train(tmp_path, **kw)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_registered_name_in_another_process_says_how_to_pass_it_again(tmp_path):
    from aioareal.usercode import resolve_spec

    with pytest.raises(UserError, match="handed to aioareal from Python in another process"):
        resolve_spec("python:never_registered", "reward function")


def test_import_aioareal_stays_light():
    import subprocess
    import sys

    code = "import sys, aioareal; print('torch' in sys.modules, 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_run_that_fails_at_start_up_leaves_no_directory(tmp_path, tiny_model_path):
    def wrong_length(completions, **kwargs):
        return [1.0]  # one reward for a whole group: the start-up check refuses it

    with pytest.raises(UserError, match="wrong_length"):
        train(tmp_path, reward_funcs=[wrong_length])
    assert not (tmp_path / "run").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")  # a directory with other files stays
    with pytest.raises(UserError, match="wrong_length"):
        train(tmp_path, reward_funcs=[wrong_length], run_dir=tmp_path / "mine")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]
