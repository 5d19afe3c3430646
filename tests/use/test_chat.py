"""`python -m aioareal chat`: one-shot --prompt, piped prompts (one per line, or the whole input), the
raw format of the tiny model, multi-turn history through a chat template, escaped control characters."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest

from aioareal.cli import main
from aioareal.errors import UserError
from aioareal.models import load_model, load_tokenizer
from aioareal.use.chat import Conversation

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


class Piped(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_one_shot_prompt_answers_from_the_tiny_model(tiny_model_path, capsys):
    assert main(["chat", str(tiny_model_path), "--prompt", "12+34="]) == 0
    said = capsys.readouterr()
    out = said.out
    assert out.strip() and out.endswith("\n")
    assert out.strip()[0].isdigit()  # the warm-started model answers sums with digits
    loading, ready = said.err.splitlines()[-2:]  # the load is said on stderr, before the first reply
    assert loading.startswith("chat: loading ") and ready.startswith("chat: ready in ")


def test_piped_prompts_are_answered_one_per_line(tiny_model_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Piped("12+34=\n\n5+6=\n"))
    assert main(["chat", str(tiny_model_path), "--max-new-tokens", "4"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2  # the blank line is skipped


def test_the_whole_input_can_be_one_prompt(tiny_model_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Piped("12+\n34=\n"))
    assert main(["chat", str(tiny_model_path), "--whole-input", "--max-new-tokens", "4"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 1


def test_a_chat_template_carries_the_history(tiny_model_path, capsys):
    import torch

    tokenizer = load_tokenizer(str(tiny_model_path))
    tokenizer.chat_template = TEMPLATE
    model = load_model(str(tiny_model_path), torch.float32, torch.device("cpu"))
    talk = Conversation(model, tokenizer, "be brief", max_new_tokens=3, temperature=0.0)
    first = talk.reply("1+1=")
    assert talk.render("2+2=") == f"<system>be brief\n<user>1+1=\n<assistant>{first}\n<user>2+2=\n<assistant>"
    capsys.readouterr()


def test_a_raw_model_keeps_no_history(tiny_model_path, capsys):
    import torch

    tokenizer = load_tokenizer(str(tiny_model_path))
    model = load_model(str(tiny_model_path), torch.float32, torch.device("cpu"))
    talk = Conversation(model, tokenizer, None, max_new_tokens=3, temperature=0.0, chat=False)
    talk.reply("1+1=")
    assert talk.render("2+2=") == "2+2=" and not talk.history
    capsys.readouterr()


def test_two_targets_are_one_line_of_error(capsys):
    assert main(["chat", "tiny", "tiny", "--prompt", "x"]) == 2
    assert "one TARGET" in capsys.readouterr().err


@pytest.mark.slow
def test_chat_reads_a_real_pipe(tiny_model_path):
    result = subprocess.run([sys.executable, "-m", "aioareal", "chat", str(tiny_model_path), "--temperature", "0.5"],
                            input="12+34=\n7+8=\n", capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    # One reply line per prompt line. Sampled: a reply may be empty (EOS first, rarely), still its own line.
    assert result.stdout.count("\n") == 2 and result.stdout.endswith("\n"), result.stdout


def test_the_prompt_format_follows_the_run_then_the_model(tiny_model_path, tmp_path):
    from aioareal.config import load_config
    from aioareal.use.chat import uses_chat_template

    assert not uses_chat_template(load_config(), True, "x")  # the default task: raw sums
    assert uses_chat_template(load_config(None, ["data.task=gsm8k"]), True, "x")
    assert uses_chat_template(load_config(None, ["arithmetic.style=chat"]), True, "x")
    assert not uses_chat_template(load_config(None, ["data.chat_template=false"]), False, "x")
    assert not uses_chat_template(load_config(), False, str(tiny_model_path))  # the warm-started tiny model
    assert uses_chat_template(load_config(), False, str(tmp_path))  # another model: its template


def test_a_prompt_past_the_models_positions_is_one_line_and_the_conversation_goes_on(tiny_model_path, capsys,
                                                                                     monkeypatch):
    import torch

    tokenizer = load_tokenizer(str(tiny_model_path))
    tokenizer.chat_template = TEMPLATE
    model = load_model(str(tiny_model_path), torch.float32, torch.device("cpu"))
    positions = model.config.max_position_embeddings
    talk = Conversation(model, tokenizer, None, max_new_tokens=64, temperature=0.0)
    with pytest.raises(UserError, match=f"the prompt is .* tokens, past the model's {positions:,} positions"):
        talk.reply("1" * (positions + 10))
    assert talk.history == []  # nothing half-remembered
    near = "1" * (positions - 50)  # fits, with fewer new tokens than asked
    talk.reply(near, stream=False)
    assert "this reply is cut at" in capsys.readouterr().err
    # On the command line a piped over-long line is said, and the next line is still answered.
    monkeypatch.setattr(sys, "stdin", Piped("1" * (positions + 10) + "\n12+34=\n"))
    assert main(["chat", str(tiny_model_path), "--max-new-tokens", "4"]) == 0
    said = capsys.readouterr()
    assert "error: the prompt is" in said.err and said.out.strip()


def test_chat_renders_through_the_bounded_renderer_and_says_a_template_error_in_one_line(tiny_model_path):
    import torch

    tokenizer = load_tokenizer(str(tiny_model_path))
    model = load_model(str(tiny_model_path), torch.float32, torch.device("cpu"))
    talk = Conversation(model, tokenizer, None, max_new_tokens=4, temperature=0.0)
    tokenizer.chat_template = "{{ ('x' * 50000000)|length }}"  # one expression of 50 MB: sized before it is made
    with pytest.raises(UserError, match="the chat template of .* would make a value of about 50,000,000 characters"):
        talk.render("hi")
    tokenizer.chat_template = "{{ raise_exception('no\\x1b[2J\\nturns\\r here') }}"  # the model's files speak
    with pytest.raises(UserError) as e:
        talk.render("hi")
    line = str(e.value)
    assert line.startswith("the model's chat template refused the conversation: TemplateError: no\\x1b[2J\\nturns")
    assert not any(ord(c) < 32 for c in line)
