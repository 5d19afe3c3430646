"""A chat template is bounded by the work that matters (docs/reliability.md#bounded-readers): one
expression, a filter, a method call or a constant Jinja folds while compiling cannot make a value
past its size or a number past its bits, and a render cannot make more than its characters of work;
real templates render exactly as transformers renders them."""
from __future__ import annotations

import tracemalloc

import pytest
from template_helpers import tokenizer_with
from transformers.utils import chat_template_utils

from aioareal.models.template_sandbox import MAX_VALUE_CHARS, MAX_WORK_CHARS, apply_template

# Each escaped the old bound (a count of template lines): one or a few lines, each making tens of
# megabytes (or a number of millions of bits) in one expression, or folded while compiling.
ESCAPES = {
    "a power": "{{ (3 ** 4000000) % 10 }}",
    "a power of powers": "{% set n = 10 %}{{ n ** (n ** 8) }}",
    "a product of numbers": "{% set ns = namespace(n=7) %}{% for i in range(20) %}{% set ns.n = ns.n * ns.n %}"
                            "{% endfor %}{{ ns.n % 10 }}",
    "a string product": "{{ ('x' * 50000000)|length }}",
    "a folded filter": "{{ 'x'|center(30000000)|length }}",
    "a quadratic replace": "{% set s = 'x' * 3000 %}{{ s|replace('x', s)|length }}",
    "a method": "{{ 'x'.ljust(30000000)|length }}",
    "a format width": "{{ '%030000000d'|format(1)|length }}",
    "a format spec": "{{ '{:>30000000}'.format(1)|length }}",
    "a percent width": "{{ ('%.30000000f' % 1.5)|length }}",
    "references printed whole": "{% set s = 'x' * 30000 %}{{ ([s] * 1000)|string|length }}",
    "a doubling concatenation": "{% set ns = namespace(s='xx') %}{% for i in range(25) %}{% set ns.s = ns.s ~ ns.s %}"
                                "{% endfor %}{{ ns.s|length }}",
    "a join of references": "{% set s = 'x' * 30000 %}{{ s.join(['a'] * 1000)|length }}",
}



@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_one_expression_cannot_escape_the_bound(case):
    tokenizer = tokenizer_with(ESCAPES[case])
    tracemalloc.start()
    try:
        with pytest.raises(Exception) as e:
            apply_template(tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(e.value)
    assert message.startswith("the chat template of ") and " would make " in message, message
    assert "\n" not in message and "data.chat_template=false" in message
    assert peak < 4 * MAX_VALUE_CHARS  # refused before it was made, not after


def test_a_render_is_bounded_by_the_characters_it_makes():
    # Each value fits, but a loop of them makes far more than a render may: stopped once the sum passes.
    loop = "{% for i in range(100) %}{% set s = 'x' * 3000000 %}{% endfor %}done"
    with pytest.raises(Exception, match=f"at most {MAX_WORK_CHARS:,}"):
        apply_template(tokenizer_with(loop), [{"role": "user", "content": "hi"}])


REAL = {  # the shapes real templates take: ChatML (SmolLM2), Llama 3's tools and dates, Gemma's turns
    "chatml": "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
              "{{ '<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] "
              "+ '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|im_start|>assistant\n' }}{% endif %}",
    "tools": "{{ bos_token }}{% set date = strftime_now('%d %b %Y') %}{% set ns = namespace(n=0) %}"
             "{% if tools %}{% for t in tools %}{{ t|tojson(indent=4) }}\n{% set ns.n = ns.n + 1 %}{% endfor %}"
             "{% endif %}{% for m in messages %}{% if m['role'] not in ['user', 'system', 'tool'] %}"
             "{{ raise_exception('bad role') }}{% endif %}<|{{ m['role'] }}|>{{ m['content']|trim }}"
             "{{ '%d' % ns.n }}{% endfor %}{{ '<|assistant|>' * 1 if add_generation_prompt }}",
    "gemma": "{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
             "{{ '<start_of_turn>' ~ role ~ '\n' ~ (m['content'] | trim) ~ '<end_of_turn>\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}",
}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer", "maximum": 10_000_000_000}}}}}]


@pytest.mark.parametrize("case", sorted(REAL))
def test_real_templates_render_as_transformers_renders_them(case, monkeypatch):
    tokenizer = tokenizer_with(REAL[case])
    messages = [{"role": "system", "content": "Be brief. " * 50}, {"role": "user", "content": " 23+45= "}]
    ours = apply_template(tokenizer, messages, add_generation_prompt=True, tools=TOOLS)
    monkeypatch.setattr(chat_template_utils, "_compile_jinja_template",
                        chat_template_utils._cached_compile_jinja_template)  # transformers' own, unbounded
    theirs = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, tools=TOOLS)
    assert ours == theirs and len(ours) > 100
