"""TRL's data and reward functions, as is: a conversational dataset (a `prompt` column of
{role, content} messages) renders through the chat template; reward functions get what TRL's
GRPOTrainer passes (completions as assistant messages for conversational rows, `prompts` as
messages, `completion_ids`, the dataset's columns), and the metrics log each function's mean and
std (`reward/<name>/mean`, `reward/<name>/std`) and the fraction of completions cut off by the
length limit (`clipped_frac`). The reward functions below are TRL's documented examples, written out."""
from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path

import pytest

from aioareal.config import load_config
from aioareal.errors import DataError
from aioareal.models import load_tokenizer
from aioareal.rewards.reward_functions import WeightedRewards, load_reward_functions
from aioareal.rewards.service import RewardService
from aioareal.run.build import task_from
from aioareal.tasks.base import PromptRenderer

# From TRL's GRPOTrainer documentation ("Using a custom reward function"), unchanged.
TRL_REWARDS = '''
import re

def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]

def reward_func(completion_ids, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of token count)."""
    return [float(len(ids)) for ids in completion_ids]

seen = []

def spy(prompts, completions, completion_ids, solution, **kwargs):
    seen.append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids, solution=solution))
    return [0.0] * len(completions)
'''


def conversational_rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": "Think, then answer."},
                        {"role": "user", "content": f"What is {i} + 1?"}],
             "solution": str(i + 1)} for i in range(n)]


@pytest.fixture
def trl(tmp_path, monkeypatch) -> str:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "trl_rewards.py").write_text(textwrap.dedent(TRL_REWARDS))
    import importlib
    import sys

    sys.modules.pop("trl_rewards", None)
    importlib.invalidate_caches()
    return "trl_rewards"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def file_task(tmp_path: Path, *overrides: str):
    data = write_jsonl(tmp_path / "chat.jsonl", conversational_rows(30))
    return load_config(overrides=["model.name=random:tiny", "data.task=file", f"data.path={data}",
                                  "data.eval_size=5", *overrides])


def test_conversational_rows_render_with_the_chat_template(tmp_path, trl):
    task = task_from(file_task(tmp_path, f"reward.functions={trl}:format_reward_func"))
    train, held_out = task.splits()
    example = train[0]
    assert example.messages[0] == {"role": "system", "content": "Think, then answer."}
    assert example.prompt.startswith("What is ")  # the last user message, for display
    text = PromptRenderer(load_tokenizer("random:tiny"), chat=True).text(example)
    assert text == (f"<|im_start|>system\nThink, then answer.<|im_end|>\n<|im_start|>user\n{example.prompt}"
                    "<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(Exception, match="needs the chat template"):
        PromptRenderer(load_tokenizer("random:tiny"), chat=False).text(example)


def test_reward_functions_get_what_trl_passes(tmp_path, trl):
    task = task_from(file_task(tmp_path, f"reward.functions=[{trl}:format_reward_func,{trl}:reward_func,{trl}:spy]"))
    train, _ = task.splits()
    rewards = task.rewards
    service = RewardService(rewards, decode=lambda ids: "".join(chr(i) for i in ids), workers=1)
    good = "<think>1 and 1</think><answer>2</answer>"
    ids = [[ord(c) for c in good], [ord(c) for c in "2"]]
    scores, failed = asyncio.run(service.score(ids, [train[0], train[1]]))
    assert failed == 0 and scores == [1.0 + len(good), 0.0 + 1]  # format + token count
    import trl_rewards

    call = trl_rewards.seen[-1]
    assert call["completions"] == [[{"role": "assistant", "content": good}], [{"role": "assistant", "content": "2"}]]
    assert call["prompts"] == [train[0].messages, train[1].messages]
    assert call["completion_ids"] == ids and call["solution"] == [train[0].row["solution"], train[1].row["solution"]]
    metrics = service.scorer_metrics()
    assert metrics["reward/format_reward_func/mean"] == 0.5 and metrics["reward/format_reward_func/std"] == 0.5
    assert metrics["reward/reward_func/mean"] == (len(good) + 1) / 2
    assert service.scorer_metrics() == {}  # drained: each metrics row covers its own step


def test_plain_rows_keep_strings_and_a_length_reward_still_works(trl):
    from aioareal.group import Example

    rewards = WeightedRewards(load_reward_functions([f"{trl}:reward_func"]))
    assert rewards(["abc"], [Example("0", "p", "a", {})], completion_ids=[[1, 2, 3, 4]]) == [4.0]


@pytest.mark.parametrize("prompt", [[], [{"role": "user"}], [{"role": "user", "content": 3}], ["hi"]])
def test_malformed_messages_name_file_line_and_field(tmp_path, prompt):
    data = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": prompt, "answer": "1"}])
    config = load_config(overrides=["data.task=file", f"data.path={data}", "data.eval_size=0"])
    with pytest.raises(DataError) as err:
        task_from(config).splits()
    message = str(err.value)
    assert "\n" not in message
    if prompt:  # an empty list is an empty field
        assert message.startswith(f"{data}:1: field 'prompt': expected a prompt string or a list of messages")


def test_a_run_on_conversational_data_logs_each_reward_function_and_clipped_frac(tmp_path, trl):
    from aioareal.run.recipe import train

    config = file_task(tmp_path, f"reward.functions=[{trl}:format_reward_func,{trl}:reward_func]",
                       "reward.weights=[1,0.01]", "train.steps=2", "eval.every=0", "algo.batch_groups=2",
                       "algo.group_size=2", f"run.run_dir={tmp_path / 'run'}", "run.dashboard=off")
    run_dir = train(config, log=lambda *_: None, printer=lambda row: None)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2
    for row in steps:
        assert row["reward/format_reward_func/mean"] == 0.0  # random weights never write the format
        assert row["reward/reward_func/mean"] == row["response_len_mean"]  # completion_ids are the tokens
        assert "reward/reward_func/std" in row and 0.0 <= row["clipped_frac"] <= 1.0
    assert any(row["clipped_frac"] > 0 for row in steps)  # 8 new tokens: random weights run into the limit
