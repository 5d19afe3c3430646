"""Prompts are bounded before training (docs/reliability.md#bounded-readers): a chat template that
loops or recurses without end is stopped after a counted number of steps with one line naming it;
a row far longer than any prompt of data.max_prompt_tokens is refused (or skipped and counted)
without being tokenized whole."""
from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from template_helpers import tokenizer_with

from aioareal.episodes.handle import Codec
from aioareal.errors import UserError
from aioareal.group import Example
from aioareal.models.shapes import build_char_tokenizer
from aioareal.run.build import encode_prompts
from aioareal.tasks.base import PromptRenderer

LOOPS = {  # each would run millions of steps (or forever) before the first prompt is ready
    "nested ranges": "{% for a in range(3000) %}{% for b in range(3000) %}x{% endfor %}{% endfor %}",
    "a loop over a variable": "{% set r = range(2000) %}{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}",
    "a recursive macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "a recursive loop": "{% for m in [[1]] recursive %}{{ loop([[1]]) }}{% endfor %}",
}



@pytest.mark.parametrize("case", sorted(LOOPS))
def test_a_template_that_does_not_end_is_one_line_naming_it(case):
    renderer = PromptRenderer(tokenizer_with(LOOPS[case]), chat=True)
    tracer = sys.gettrace()
    with pytest.raises(UserError) as e:
        encode_prompts([Example("q1", "1+1", "2")], renderer, 64, False, "training", print)
    message = str(e.value)
    assert message.startswith("the chat template of ") and "\n" not in message
    assert "data.chat_template=false" in message
    assert sys.gettrace() is tracer  # a debugger's or coverage's tracer is given back


EXPANSIONS = {  # few template lines, each building a huge string in one expression
    "a string product": '{{ "x" * 50000000 }}',
    "a join of ranges": '{{ range(20000)|join(range(300)|join("a")) }}',
}


@pytest.mark.parametrize("case", sorted(EXPANSIONS))
def test_a_template_that_expands_hugely_ends_at_the_first_prompt(case, monkeypatch):
    renderer = PromptRenderer(tokenizer_with(EXPANSIONS[case]), chat=True)
    rendered = []
    text = renderer.text
    monkeypatch.setattr(renderer, "text", lambda example: rendered.append(1) or text(example))
    rows = [Example(f"q{i}", "1+1", "2") for i in range(5)]
    with pytest.raises(UserError, match=r"^the chat template of .* would make (a value|output) of about [0-9,]+ "
                                        r"characters \(at most 4,000,000\) for one prompt"):
        encode_prompts(rows, renderer, 64, False, "training", print)
    assert len(rendered) == 1


def test_an_episode_template_that_does_not_end_stops_the_run_not_falls_back():
    tokenizer = tokenizer_with(LOOPS["nested ranges"])
    codec = Codec(tokenizer.encode, tokenizer.decode, tokenizer.decode, template=tokenizer)
    with pytest.raises(UserError, match="the chat template of"):
        codec.observation("42", "tool", "")


def test_real_templates_render_as_transformers_renders_them():
    tokenizer = build_char_tokenizer()
    renderer = PromptRenderer(tokenizer, chat=True, system_prompt="Be brief.")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1"}]
    assert renderer.text(Example("q", "1+1", "2")) == tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


def test_a_huge_row_is_refused_without_tokenizing_it(monkeypatch):
    tokenizer = build_char_tokenizer()
    tokenized: list[int] = []
    real = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text, **kw: (tokenized.append(len(text)), real(text, **kw))[1])
    renderer = PromptRenderer(tokenizer, chat=False)
    rows = [Example("small", "1+1=", "2"), Example("huge", "9" * 5_000_000, "9")]
    with pytest.raises(UserError) as e:
        encode_prompts(rows, renderer, 16, False, "training", print)
    assert str(e.value).startswith("training prompt 'huge' has 5,000,000 characters (so over 16 tokens), more than "
                                   "data.max_prompt_tokens=16")
    assert max(tokenized) < 10_000
    logged: list[str] = []
    kept, ids = encode_prompts(rows, renderer, 16, True, "training", logged.append)
    assert [e.uid for e in kept] == ["small"] and logged == ["skipped 1 training prompts longer than "
                                                             "data.max_prompt_tokens=16"]
    assert max(tokenized) < 10_000


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=400), limit=st.integers(1, 40))
def test_the_character_bound_never_refuses_a_prompt_that_fits(text, limit):
    renderer = PromptRenderer(build_char_tokenizer(), chat=False)
    if len(renderer.encode(text)) <= limit:
        assert len(text) <= renderer.most_chars(limit)
