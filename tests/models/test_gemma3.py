"""Gemma 3 270M on its real weights (slow; where its five packages are installed): the named model
joined from its chunk packages and converted once, raw prompts that begin with the <bos> its
tokenizer adds (without it the model writes garbage, with it sums), the engine's log-probs equal
to the model's own forward past the 512-token sliding window (fp32 to 1e-4, bf16 within rounding),
its greedy completions equal to transformers' `generate` on the same text, and `export --gguf`
refusing it in one line. The 2-layer random shapes of every family are tested in
tests/generation; random weights do not care about BOS, real ones do."""
from __future__ import annotations

import pytest
import torch
from engine_helpers import generate, reference_logprobs
from real_models import named_source

from aioareal.errors import UserError
from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.group import Group
from aioareal.models import eos_token_ids, load_model, load_tokenizer
from aioareal.models.gguf_export import export_gguf
from aioareal.models.prompt_encoding import PromptEncoder
from aioareal.tasks.arithmetic import ArithmeticTask
from aioareal.tasks.base import PromptRenderer

pytestmark = pytest.mark.slow
pytest.importorskip("gguf")

CPU = torch.device("cpu")
QUESTION = "Question: What is 12 plus 7?\nAnswer:"
BF16_MEAN, BF16_MAX = 0.15, 1.0  # bf16 rounding over 18 layers against the fp32 forward
GEMMA_TURNS = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else "
               "m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
               "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="module")
def gemma() -> str:
    return named_source("gemma3-270m")


@pytest.fixture(scope="module")
def fp32(gemma):
    return load_model(gemma, torch.float32, CPU).eval()


def long_prompt(tokenizer) -> list[int]:
    """A raw prompt of over 600 tokens: past the 512-token window of Gemma 3's local layers."""
    text = "".join(f"Question: What is {a} plus {a + 3}?\nAnswer: {2 * a + 3}\n\n" for a in range(40)) + QUESTION
    ids = PromptEncoder(tokenizer)(text)
    assert len(ids) > 600 and ids[0] == tokenizer.bos_token_id
    return ids


def engine_gaps(path: str, dtype: torch.dtype, reference, prompts: list[list[int]], eos: list[int]) -> torch.Tensor:
    model = load_model(path, dtype, CPU)
    options = EngineOptions(num_slots=4, max_len=1024, params=SamplingParams(max_new_tokens=24), seed=0)
    groups = generate(Engine(model, eos, options), [Group(i, p, size=2) for i, p in enumerate(prompts)])
    assert all(len(c.tokens) > 0 for g in groups for c in g.completions)
    return torch.cat([(torch.tensor(c.logprobs) - reference_logprobs(reference, g.prompt_ids, c.tokens)).abs()
                      for g in groups for c in g.completions])


def test_engine_logprobs_equal_the_models_forward_past_the_sliding_window(gemma, fp32):
    tokenizer = load_tokenizer(gemma)
    prompts = [long_prompt(tokenizer), PromptEncoder(tokenizer)(QUESTION)]
    eos = eos_token_ids(fp32, tokenizer)
    gaps = engine_gaps(gemma, torch.float32, fp32, prompts, eos)
    assert gaps.max() < 1e-4, gaps.max()
    bf16 = engine_gaps(gemma, torch.bfloat16, fp32, prompts, eos)
    assert bf16.mean() < BF16_MEAN and bf16.max() < BF16_MAX, (bf16.mean(), bf16.max())
    assert bf16.mean() > 1e-4  # it did run in bf16


def test_greedy_completions_equal_transformers_generate_and_need_the_bos(gemma, fp32):
    tokenizer = load_tokenizer(gemma)
    eos = eos_token_ids(fp32, tokenizer)
    texts = [QUESTION, "Question: What is 23 plus 45?\nAnswer:", "The capital of France is"]
    options = EngineOptions(num_slots=4, max_len=256, params=SamplingParams(greedy=True, max_new_tokens=12), seed=0)
    engine = Engine(load_model(gemma, torch.float32, CPU), eos, options)
    for text in texts:
        theirs = tokenizer(text, return_tensors="pt")  # transformers' own encoding: <bos> first
        ours = PromptEncoder(tokenizer)(text)
        assert ours == theirs["input_ids"][0].tolist()
        out = fp32.generate(**theirs, max_new_tokens=12, do_sample=False, eos_token_id=eos,
                            pad_token_id=tokenizer.pad_token_id)
        [group] = generate(engine, [Group(0, ours, size=1)])
        assert group.completions[0].tokens == out[0, len(ours):].tolist()[:len(group.completions[0].tokens)]
    [answer] = generate(engine, [Group(0, PromptEncoder(tokenizer)(QUESTION), size=1)])
    assert "19" in tokenizer.decode(answer.completions[0].tokens)  # "12 + 7 = 19"
    # A chat prompt, in Gemma's turn format (its base GGUF carries no template): the template renders
    # <bos> itself, so it is encoded as rendered, as apply_chat_template(tokenize=True) does.
    tokenizer.chat_template = GEMMA_TURNS
    messages = [{"role": "user", "content": "What is 12 plus 7?"}]
    theirs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ours = PromptEncoder(tokenizer)(rendered, templated=True)
    assert ours == theirs["input_ids"][0].tolist() and ours.count(tokenizer.bos_token_id) == 1
    out = fp32.generate(**theirs, max_new_tokens=12, do_sample=False, eos_token_id=eos,
                        pad_token_id=tokenizer.pad_token_id)
    [group] = generate(engine, [Group(0, ours, size=1)])
    assert group.completions[0].tokens == out[0, len(ours):].tolist()[:len(group.completions[0].tokens)]


def test_question_style_prompts_begin_with_bos_once(gemma):
    tokenizer = load_tokenizer(gemma)
    task = ArithmeticTask(style="question", eval_size=20)
    renderer = PromptRenderer(tokenizer, chat=task.chat)
    for example in task.splits()[1]:
        ids = renderer.ids(example)
        assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
        assert renderer.check(example, ids) is None


def test_export_refuses_gemma_in_one_line(gemma, fp32, tmp_path):
    with pytest.raises(UserError, match=r"^export: a gemma3_text model; GGUF export writes llama and qwen2 models$"):
        export_gguf(fp32, load_tokenizer(gemma), tmp_path / "gemma.gguf")
    assert not list(tmp_path.iterdir())
