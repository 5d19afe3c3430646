"""`python -m aioareal sft` (run/sft.py): demonstrations taught with the loss on completion tokens only;
a short run lowers the held-out loss; a run stopped after any step and resumed trains the same steps on
the same demonstrations to the same weights, each step logged once; an RL run starts from its policy
with model.name=RUN; GSM8K's solutions become boxed-answer demonstrations."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from aioareal.cli import main
from aioareal.config import load_config
from aioareal.errors import UserError
from aioareal.grading.final_answer import extract_answer
from aioareal.models import load_model, load_tokenizer
from aioareal.run import sft as sft_module
from aioareal.run.build import model_path
from aioareal.run.sft import batch_at, boxed_solution, schedule, sft
from aioareal.trainer import objective as supervised
from aioareal.trainer.objective import Demo, completion_loss

SLICE = Path(__file__).resolve().parents[1] / "data" / "gsm8k"
RANDOM = ["model.name=random:tiny", "data.eval_size=50", "sft.eval_size=16", "sft.batch_size=8", "sft.micro_batch=4",
          "sft.lr=3e-3", "sft.warmup_steps=2", "run.dashboard=off"]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_short_run_lowers_the_held_out_loss(tmp_path):
    run = tmp_path / "sft"
    sft(load_config(None, [*RANDOM, "sft.steps=30", "sft.eval_every=10", f"run.run_dir={run}"]), log=lambda _: None)
    rows = metrics(run)
    held = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert [r["step"] for r in rows] == list(range(31)) and len(held) == 4
    assert held[-1] < 0.6 * held[0], held  # a random model learns the sums' format and digits
    assert (run / "DONE").is_file() and (run / "checkpoints" / "step-000030" / "policy").is_dir()


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step-{step:06d}" / "policy" / "model.safetensors")


def test_a_run_stopped_after_any_step_resumes_to_the_same_weights(tmp_path, monkeypatch):
    keys = [*RANDOM, "sft.steps=5", "sft.eval_every=2", "run.checkpoint_every=2"]
    whole = tmp_path / "whole"
    sft(load_config(None, [*keys, f"run.run_dir={whole}"]), log=lambda _: None)

    cut = tmp_path / "cut"
    real_step = sft_module._optimizer_step
    calls = {"n": 0}

    def dies_at_step_4(*args):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # killed mid-step, after checkpoint 2 and step 3's metrics row
        return real_step(*args)
    monkeypatch.setattr(sft_module, "_optimizer_step", dies_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        sft(load_config(None, [*keys, f"run.run_dir={cut}"]), log=lambda _: None)
    assert [r["step"] for r in metrics(cut)] == [0, 1, 2, 3]
    monkeypatch.setattr(sft_module, "_optimizer_step", real_step)
    assert main(["sft", "--resume", str(cut)]) == 0
    assert [r["step"] for r in metrics(cut)] == list(range(6))  # step 3 trained again once, logged once
    for name, tensor in weights(whole, 5).items():
        torch.testing.assert_close(weights(cut, 5)[name], tensor, atol=1e-6, rtol=1e-5)
    assert [r["loss"] for r in metrics(cut)[1:]] == pytest.approx([r["loss"] for r in metrics(whole)[1:]], rel=1e-5)
    assert main(["sft", "--resume", str(cut)]) == 0  # finished: nothing to do, nothing changed
    assert len(metrics(cut)) == 6


def test_a_fresh_run_refuses_a_directory_holding_one(tmp_path):
    run = tmp_path / "sft"
    sft(load_config(None, [*RANDOM, "sft.steps=1", f"run.run_dir={run}"]), log=lambda _: None)
    with pytest.raises(UserError, match="already holds a run"):
        sft(load_config(None, [*RANDOM, "sft.steps=1", f"run.run_dir={run}"]), log=lambda _: None)


def test_rl_starts_from_an_sft_run(tmp_path):
    run = tmp_path / "sft"
    sft(load_config(None, [*RANDOM, "sft.steps=2", f"run.run_dir={run}"]), log=lambda _: None)
    said: list[str] = []
    path = model_path(load_config(None, [f"model.name={run}"]), said.append)
    assert path == str(run / "checkpoints" / "step-000002" / "policy") and path in said[0]
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "config.yaml").write_text("{}\n")
    with pytest.raises(UserError, match="no readable checkpoint"):
        model_path(load_config(None, [f"model.name={empty}"]), said.append)


@pytest.mark.parametrize("chunked", [False, True])
def test_the_loss_counts_completion_tokens_only(chunked, monkeypatch):
    """completion_loss against the model's own forward: -sum log p(completion | prompt), whatever
    the prompt's tokens are, for rows of different lengths in one batch; the same by the plain
    forward's logits and by the trainer's chunked head (a large vocabulary's path)."""
    if chunked:
        monkeypatch.setattr(supervised, "FULL_LOGITS", 0)
    model = load_model("random:tiny", torch.float32, torch.device("cpu"))
    demos = [Demo([1, 5, 6, 7], [8, 9, 2]), Demo([1, 4], [10, 11, 12, 13, 2])]
    loss, tokens = completion_loss(model, demos, torch.device("cpu"))
    loss = loss.detach()
    expected = 0.0
    for d in demos:
        ids = torch.tensor([d.prompt + d.completion])
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        n = len(d.prompt)
        expected -= sum(logp[n - 1 + j, t].item() for j, t in enumerate(d.completion))
    assert tokens == 8 and float(loss) == pytest.approx(expected, rel=1e-5)
    taught, count = completion_loss(model, [Demo([1, 4], [10, 11, 12, 13, 2], [True, False, False, True, True])],
                                    torch.device("cpu"))
    assert count == 3 and float(taught.detach()) < float(loss)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.integers(1, 9), st.integers(0, 100), st.integers(0, 5))
def test_each_epoch_shows_every_demonstration_once(count, size, start, seed):
    """The order is a function of the cursor alone: batches in sequence cover each epoch exactly."""
    epochs = 2
    order = [i for c in range(0, epochs * count, size) for i in batch_at(c, size, count, seed)][:epochs * count]
    for e in range(epochs):
        assert sorted(order[e * count:(e + 1) * count]) == list(range(count))
    assert batch_at(start, size, count, seed) == batch_at(start, size, count, seed)


def test_the_schedule_warms_up_then_decays_to_a_tenth():
    s = load_config(None, ["sft.steps=100", "sft.warmup_steps=10", "sft.lr=1e-4"]).sft
    assert schedule(5, s) == pytest.approx(5e-5) and schedule(10, s) == pytest.approx(1e-4)
    assert schedule(100, s) == pytest.approx(1e-5) and schedule(55, s) == pytest.approx(5.5e-5)


def test_gsm8k_solutions_become_boxed_demonstrations():
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nSo 48+24 = <<48+24=72>>72 in all.\n#### 72"
    text = boxed_solution(solution)
    assert "<<" not in text and "####" not in text and text.endswith("The final answer is \\boxed{72}.")
    assert extract_answer(text) == "72"


def test_gsm8k_demonstrations_render_as_rl_prompts(tiny_model_path):
    """The task's own demonstrations: each GSM8K train row's prompt as RL renders it, its boxed
    solution after it, EOS last; the held-out split is never read."""
    config = load_config(None, ["data.task=gsm8k", f"data.path={SLICE / 'train.jsonl'}",
                                f"data.eval_path={SLICE / 'test.jsonl'}", "sft.eval_size=4", "data.chat_template=false",
                                "data.prompt_template={question}", "sft.max_tokens=4000"])
    tokenizer = load_tokenizer(str(tiny_model_path))
    train, held = sft_module.demonstrations(config, tokenizer, log=lambda _: None)
    assert len(train) == 96 and len(held) == 4
    texts = {tokenizer.decode(d.prompt + d.completion) for d in train + held}
    rows = [json.loads(line) for line in (SLICE / "train.jsonl").read_text().splitlines()]
    first = next(t for t in texts if t.startswith(rows[0]["question"].strip()))
    assert "\\boxed{72}" in first and all(d.completion[-1] == tokenizer.eos_token_id for d in train)


def test_a_demonstrations_file_needs_its_columns(tmp_path, capsys):
    rows = tmp_path / "demos.jsonl"
    rows.write_text(json.dumps({"prompt": "2+2=", "completion": "4"}) + "\n" + json.dumps({"prompt": "1+1="}) + "\n")
    code = main(["sft", "--run-dir", str(tmp_path / "run"), *RANDOM, f"sft.path={rows}", "sft.eval_size=0",
                 "data.chat_template=false"])
    err = capsys.readouterr().err
    assert code == 2 and "demos.jsonl:2" in err and "completion" in err and err.count("\n") == 1


def test_a_demonstrations_file_trains(tmp_path):
    rows = tmp_path / "demos.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "completion": str(2 * a)}) + "\n" for a in range(40)))
    run = tmp_path / "run"
    code = main(["sft", "--run-dir", str(run), *RANDOM, f"sft.path={rows}", "sft.eval_size=8", "sft.steps=3",
                 "data.chat_template=false"])
    assert code == 0 and [r["step"] for r in metrics(run)] == [0, 1, 2, 3]


def test_rl_on_gsm8k_rows_starts_from_an_sft_run_and_logs_reward(tmp_path):
    """The two stages of configs/smollm2-gsm8k-cpu.yaml, on the tiny model and the committed slice: an
    SFT run on GSM8K's solutions, then a short RL run from it (model.name=RUN) on GSM8K rows, graded
    by the GSM8K grader, with a held-out check at its start and end."""
    from aioareal.run.recipe import train

    gsm8k = ["data.task=gsm8k", f"data.path={SLICE / 'train.jsonl'}", f"data.eval_path={SLICE / 'test.jsonl'}",
             "data.chat_template=false", "data.prompt_template={question}\nAnswer:", "data.max_prompt_tokens=1000"]
    first = tmp_path / "sft"
    sft(load_config(None, [*RANDOM, *gsm8k, "sft.steps=2", "sft.max_tokens=1000", f"run.run_dir={first}"]),
        log=lambda _: None)
    second = tmp_path / "rl"
    said: list[str] = []
    config = load_config(None, [*gsm8k, f"model.name={first}", "train.steps=2", "algo.group_size=2",
                                "algo.batch_groups=2", "generation.max_new_tokens=8", "data.eval_size=4",
                                "eval.every=0", "run.dashboard=off", f"run.run_dir={second}"])
    train(config, log=said.append, printer=lambda row: None)
    rows = metrics(second)
    assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2]
    assert all(0.0 <= r["reward_mean"] <= 1.0 for r in rows if "reward_mean" in r)
    assert sum("eval_pass_rate" in r for r in rows) >= 2
    assert any(str(first / "checkpoints" / "step-000002" / "policy") in line for line in said)


def test_each_stage_resumes_only_its_own_runs(tmp_path, capsys):
    """`sft --resume` on an RL run, and an RL `--resume` on an sft run, are one line each: neither
    trains into the other's directory (or prunes its checkpoints)."""
    from aioareal.run.recipe import train

    first = tmp_path / "sft"
    sft(load_config(None, [*RANDOM, "sft.steps=3", "run.checkpoint_every=1", f"run.run_dir={first}"]),
        log=lambda _: None)
    (first / "DONE").unlink()  # as if stopped: an RL resume would otherwise have "nothing to do"
    assert main(["--resume", str(first), "train.steps=5"]) == 2
    assert "an sft run; continue it with python -m aioareal sft --resume" in capsys.readouterr().err
    rl = tmp_path / "rl"
    train(load_config(None, ["train.steps=1", "algo.batch_groups=2", "eval.every=0", "run.dashboard=off",
                             f"run.run_dir={rl}"]), log=lambda _: None, printer=lambda row: None)
    assert main(["sft", "--resume", str(rl)]) == 2
    assert "not an sft run" in capsys.readouterr().err
    assert len(list((rl / "checkpoints").iterdir())) == 1


def test_masters_stay_fp32_when_the_forward_autocasts(tmp_path):
    """model.train_dtype=bfloat16: the forward autocasts, the weights Adam updates and saves are fp32
    (a step of about lr would be lost below a bf16 weight's rounding)."""
    run = tmp_path / "sft"
    sft(load_config(None, [*RANDOM, "sft.steps=2", "model.train_dtype=bfloat16", f"run.run_dir={run}"]),
        log=lambda _: None)
    assert {t.dtype for t in weights(run, 2).values()} == {torch.float32}


def test_a_lora_run_resumes_to_the_same_adapter_and_the_adapter_alone_is_the_policy(tmp_path, monkeypatch):
    """model.lora_rank > 0: only the adapters train, a run killed mid-way resumes to the unbroken run's
    adapter, and the checkpoint's adapter/ (a few MB, what a repository can keep) loads as model.name
    to the same weights as its merged policy/."""
    pytest.importorskip("peft")
    monkeypatch.setenv("AIOAREAL_CACHE_DIR", str(tmp_path / "cache"))
    keys = [*RANDOM, "model.lora_rank=4", "sft.steps=4", "sft.lr=1e-2", "run.checkpoint_every=2"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    sft(load_config(None, [*keys, f"run.run_dir={whole}"]), log=lambda _: None)
    held = [r["eval_loss"] for r in metrics(whole) if "eval_loss" in r]
    assert held[-1] < held[0], held
    real_step = sft_module._optimizer_step
    calls = {"n": 0}

    def dies_at_step_3(*args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_step(*args)
    monkeypatch.setattr(sft_module, "_optimizer_step", dies_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        sft(load_config(None, [*keys, f"run.run_dir={cut}"]), log=lambda _: None)
    monkeypatch.setattr(sft_module, "_optimizer_step", real_step)
    assert main(["sft", "--resume", str(cut)]) == 0
    adapter = cut / "checkpoints" / "step-000004" / "adapter"
    unbroken = load_file(whole / "checkpoints" / "step-000004" / "adapter" / "adapter_model.safetensors")
    for name, tensor in load_file(adapter / "adapter_model.safetensors").items():
        torch.testing.assert_close(tensor, unbroken[name], atol=1e-6, rtol=1e-5)
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == "random:tiny"
    merged = load_model(str(adapter), torch.float32, torch.device("cpu")).state_dict()
    for name, tensor in weights(cut, 4).items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=1e-5)
