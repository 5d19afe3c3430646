"""eos_token_ids: a completion ends at the tokenizer's EOS, the model's, and a chat template's end of
turn where the vocabulary has one (Gemma 3's `<end_of_turn>` is not its EOS)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from aioareal.errors import UserError
from aioareal.models import eos_token_ids


class Vocab:
    def __init__(self, tokens: dict[str, int], eos: int | None) -> None:
        self.tokens, self.eos_token_id = tokens, eos

    def get_vocab(self) -> dict[str, int]:
        return dict(self.tokens)


def model(eos=None):
    return SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=eos))


@pytest.mark.parametrize("tokens, eos, model_eos, expected", [
    ({"<eos>": 1, "<end_of_turn>": 106, "a": 5}, 1, [1], [1, 106]),  # Gemma 3
    ({"<|im_end|>": 2, "a": 5}, 2, None, [2]),  # SmolLM2: ChatML's end of turn is its EOS
    ({"<|end_of_text|>": 128001, "<|eot_id|>": 128009}, 128001, [128001, 128009], [128001, 128009]),  # Llama 3
    ({"</s>": 2, "a": 5}, 2, 2, [2]),  # no chat tokens: EOS alone
])
def test_end_of_turn_tokens_end_a_completion(tokens, eos, model_eos, expected):
    assert eos_token_ids(model(model_eos), Vocab(tokens, eos)) == expected


def test_no_end_at_all_is_refused():
    with pytest.raises(UserError, match="no end-of-sequence token"):
        eos_token_ids(model(None), Vocab({"a": 5}, None))
