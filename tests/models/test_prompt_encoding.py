"""Prompts encoded the way the model's tokenizer forms them (models/prompt_encoding.py): a raw prompt
gets the tokenizer's own BOS once, a chat-templated one is taken as rendered, a continuation gets
nothing, nothing is appended; the start-up check names a prompt that lacks its BOS, or has it
twice; and every path that encodes prompts (training, held-out, eval, chat, episodes, warm-up)
goes through the one encoder. Tokenizers are built here with the `tokenizers` library: one that
adds BOS (as Gemma's and Llama 3 base models' do), one that adds BOS and EOS, and the offline
character tokenizer, which adds nothing."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from aioareal.config import load_config
from aioareal.group import Example
from aioareal.models.prompt_encoding import PromptEncoder, special_prefix
from aioareal.models.shapes import CHARACTERS, build_char_tokenizer
from aioareal.run.build import build_data, build_prompts
from aioareal.tasks.base import PromptRenderer

BOS, EOS, PAD = "<bos>", "<eos>", "<pad>"
# A Gemma-style template: it renders BOS itself, as Gemma's and Llama 3's do.
TEMPLATE_WITH_BOS = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                     "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
TEMPLATE_WITHOUT_BOS = TEMPLATE_WITH_BOS.removeprefix("{{ bos_token }}")


def char_tokenizer_adding(prefix: bool = True, suffix: bool = False) -> PreTrainedTokenizerFast:
    """A character tokenizer whose post-processor puts <bos> before (and <eos> after) every text."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    specials = [PAD, BOS, EOS, "<start_of_turn>", "<end_of_turn>"]
    vocab = {t: i for i, t in enumerate(specials + CHARACTERS + ["<unk>"])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    single = " ".join(([f"{BOS}:0"] if prefix else []) + ["$A:0"] + ([f"{EOS}:0"] if suffix else []))
    core.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[(BOS, vocab[BOS]), (EOS, vocab[EOS])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                        unk_token="<unk>", clean_up_tokenization_spaces=False)
    tokenizer.chat_template = TEMPLATE_WITH_BOS
    return tokenizer


ADDS_BOS = char_tokenizer_adding()
ADDS_BOTH = char_tokenizer_adding(suffix=True)
text = st.text(alphabet=st.sampled_from(CHARACTERS), max_size=40)


def test_the_prefix_is_what_the_tokenizer_puts_before_a_text():
    assert special_prefix(ADDS_BOS) == [ADDS_BOS.bos_token_id]
    assert special_prefix(ADDS_BOTH) == [ADDS_BOTH.bos_token_id]
    assert special_prefix(build_char_tokenizer()) == []


@settings(max_examples=60, deadline=None)
@given(text=text)
def test_a_raw_prompt_is_the_tokenizers_own_encoding_without_anything_after(text):
    for tokenizer in (ADDS_BOS, ADDS_BOTH):
        own = tokenizer(text)["input_ids"]
        ids = PromptEncoder(tokenizer)(text)
        assert ids == (own[:-1] if tokenizer is ADDS_BOTH else own)  # no EOS ends a prompt
        assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
    plain = build_char_tokenizer()
    assert PromptEncoder(plain)(text) == plain(text)["input_ids"]


@settings(max_examples=40, deadline=None)
@given(text=text)
def test_bos_is_never_doubled_and_templated_or_continued_text_gets_none(text):
    encode = PromptEncoder(ADDS_BOS)
    bos = ADDS_BOS.bos_token_id
    assert encode(BOS + text) == encode(text)  # a prompt written with its own <bos>
    assert encode(text, templated=True) == ADDS_BOS.encode(text, add_special_tokens=False)
    assert bos not in encode.continuation(text)  # an observation or a tool's output
    rendered = ADDS_BOS.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                            add_generation_prompt=True)
    ids = encode(rendered, templated=True)
    assert ids == ADDS_BOS.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                               add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids.count(bos) == 1


def test_the_check_names_a_missing_or_doubled_bos_and_passes_the_tokenizers_own():
    encode = PromptEncoder(ADDS_BOS)
    bos = ADDS_BOS.bos_token_id
    plain = ADDS_BOS.encode("Question: 1+2?", add_special_tokens=False)
    assert encode.check("Question: 1+2?", encode("Question: 1+2?"), templated=False) is None
    assert encode.check("Question: 1+2?", plain, templated=False) == (
        "the prompt lacks <bos>, which the tokenizer puts before every text")
    assert encode.check("Question: 1+2?", [bos, bos] + plain, templated=False) == "the prompt starts with <bos> twice"
    changed = encode("abcdef")
    changed[3] = changed[2]
    assert encode.check("abcdef", changed, templated=False) == (
        "the prompt's ids differ from the tokenizer's own encoding at token 3 (7 ids against 7)")
    assert PromptEncoder(ADDS_BOTH).check("x", PromptEncoder(ADDS_BOTH)("x"), templated=False) is None


def test_the_check_names_a_chat_template_that_renders_no_bos():
    tokenizer = char_tokenizer_adding()
    tokenizer.chat_template = TEMPLATE_WITHOUT_BOS
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             add_generation_prompt=True)
    encode = PromptEncoder(tokenizer)
    problem = encode.check(rendered, encode(rendered, templated=True), templated=True)
    assert problem is not None and problem.startswith("the chat template renders no <bos> at the start")
    assert encode.check(rendered.replace("<start_of_turn>", BOS + "<start_of_turn>", 1),
                        encode(BOS + rendered, templated=True), templated=True) is None


def test_training_and_held_out_prompts_get_bos_once_and_the_start_up_check_catches_a_missing_one(monkeypatch):
    config = load_config(overrides=["data.chat_template=false", "data.eval_size=8"])
    data = build_data(config, print)
    lines: list[str] = []
    prompts = build_prompts(config, data, ADDS_BOS, lines.append)
    bos = ADDS_BOS.bos_token_id
    assert all(ids[0] == bos and ids.count(bos) == 1 for ids in prompts.train_ids.values())
    assert all(ids[0] == bos for ids in prompts.eval_set.prompt_ids)
    assert not [line for line in lines if "prompt check" in line]
    # A path that encodes prompts as aioareal did before (no BOS): the check names it before training.
    monkeypatch.setattr(PromptEncoder, "encode", lambda self, text, templated=False: self.continuation(text))
    build_prompts(config, data, ADDS_BOS, lines.append)
    uid = prompts.train[0].uid
    assert lines[-1] == (f"warning: prompt check (row {uid}): the prompt lacks <bos>, which the tokenizer "
                         "puts before every text")


def test_chat_prompts_are_encoded_as_the_template_renders_them():
    renderer = PromptRenderer(ADDS_BOS, chat=True)
    example = Example(uid="1", prompt="What is 2 + 3?", answer="5")
    ids = renderer.ids(example)
    assert renderer.templated and ids[0] == ADDS_BOS.bos_token_id and ids.count(ADDS_BOS.bos_token_id) == 1
    raw = PromptRenderer(ADDS_BOS, chat=True, template="Q: {prompt}\nA:")
    assert not raw.templated and raw.ids(example)[0] == ADDS_BOS.bos_token_id  # a raw template wins


def test_chat_and_episodes_encode_through_the_one_encoder():
    from aioareal.episodes.handle import codec_for
    from aioareal.use.chat import Conversation

    class Model:
        generation_config = None
        config = None

    conversation = Conversation.__new__(Conversation)
    conversation.encode = PromptEncoder(ADDS_BOS)
    assert conversation.encode("12+7=")[0] == ADDS_BOS.bos_token_id
    assert ADDS_BOS.bos_token_id not in codec_for(ADDS_BOS, chat=True).encode("56088")


def test_no_other_code_encodes_text_with_its_own_rule():
    """One function decides the special tokens of every encoded prompt: no module but
    prompt_encoding.py passes add_special_tokens (bench's measurement tools aside)."""
    root = Path(__file__).parents[2] / "aioareal"
    found = [str(path.relative_to(root)) for path in root.rglob("*.py")
             if path.name != "prompt_encoding.py" and "bench" not in path.parts
             and re.search(r"add_special_tokens\s*=", path.read_text())]
    assert found == [], found


@pytest.mark.parametrize("tokenizer", [ADDS_BOS, build_char_tokenizer()])
def test_the_warm_up_and_evaluation_prompts_use_the_same_rule(tokenizer):
    example = Example(uid="1", prompt="12+7=", answer="19")
    renderer = PromptRenderer(tokenizer, chat=False)
    assert renderer.ids(example) == PromptEncoder(tokenizer)("12+7=")


def test_eval_encodes_held_out_prompts_the_same_way_and_checks_them(monkeypatch, capsys):
    from aioareal.use.eval_command import held_out

    config = load_config(overrides=["data.chat_template=false", "data.eval_size=8"])
    _, examples, ids = held_out(config, ADDS_BOS)
    assert all(row[0] == ADDS_BOS.bos_token_id and row.count(ADDS_BOS.bos_token_id) == 1 for row in ids)
    assert "prompt check" not in capsys.readouterr().err
    monkeypatch.setattr(PromptEncoder, "encode", lambda self, text, templated=False: self.continuation(text))
    held_out(config, ADDS_BOS)
    assert f"warning: prompt check (row {examples[0].uid}): the prompt lacks <bos>" in capsys.readouterr().err
