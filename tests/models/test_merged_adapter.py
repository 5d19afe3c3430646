"""A LoRA adapter directory as model.name (models/lora.py): it loads as its base with the
adapter merged, equal to peft's own forward; the merge is built once and reused; its base is found
beside the adapter or by name; pickled adapters and configs without a base are refused in one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aioareal.config import load_config
from aioareal.errors import UserError
from aioareal.models import load_model, load_tokenizer, lora
from aioareal.models.shapes import build_char_tokenizer

pytest.importorskip("peft")
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AIOAREAL_CACHE_DIR", str(tmp_path / "cache"))


def trained_adapter(tmp_path: Path, base_name: str = "../base") -> tuple[Path, torch.nn.Module]:
    """A saved tiny base, and beside it an adapter with random (non-zero) values naming it by `base_name`."""
    base = tmp_path / "base"
    load_model("random:tiny", torch.float32, CPU).save_pretrained(base)
    build_char_tokenizer().save_pretrained(base)
    config = load_config(overrides=["model.lora_rank=4"]).model
    peft_model = lora.wrap(load_model(str(base), torch.float32, CPU), config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    adapter = tmp_path / "adapter"
    lora.save_adapter(peft_model.get_base_model(), adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": base_name}))
    return adapter, peft_model.eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([[1, 5, 9, 14, 20, 7]])).logits


def test_an_adapter_directory_loads_as_its_merged_base(tmp_path, capsys):
    adapter, peft_model = trained_adapter(tmp_path)
    merged = load_model(str(adapter), torch.float32, CPU)
    assert not lora.is_lora(merged)  # a plain model: no loader downstream knows adapters exist
    torch.testing.assert_close(logits(merged), logits(peft_model), atol=1e-5, rtol=1e-5)
    base = load_model(str(tmp_path / "base"), torch.float32, CPU)
    assert (logits(base) - logits(merged)).abs().max() > 1e-3  # the adapter changed it: the check can fail
    assert load_tokenizer(str(adapter)).get_vocab() == build_char_tokenizer().get_vocab()
    assert capsys.readouterr().out.count("merging adapter") == 1
    again = load_model(str(adapter), torch.float32, CPU)  # built once: the second load reads the cache
    assert "merging adapter" not in capsys.readouterr().out
    torch.testing.assert_close(logits(again), logits(merged))


def test_the_base_is_found_by_name_or_from_the_working_directory(tmp_path, monkeypatch):
    adapter, peft_model = trained_adapter(tmp_path, base_name="base")  # not beside the adapter: from the cwd
    monkeypatch.chdir(tmp_path)
    torch.testing.assert_close(logits(load_model(str(adapter), torch.float32, CPU)), logits(peft_model),
                               atol=1e-5, rtol=1e-5)


def test_a_changed_adapter_is_merged_again(tmp_path):
    adapter, _ = trained_adapter(tmp_path)
    first = logits(load_model(str(adapter), torch.float32, CPU))
    from safetensors.torch import load_file, save_file
    weights = {k: v * 2 for k, v in load_file(adapter / "adapter_model.safetensors").items()}
    save_file(weights, str(adapter / "adapter_model.safetensors"), metadata={"format": "pt"})
    assert (logits(load_model(str(adapter), torch.float32, CPU)) - first).abs().max() > 1e-3


def test_a_pickled_adapter_or_a_missing_base_is_one_line(tmp_path):
    adapter, _ = trained_adapter(tmp_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    with pytest.raises(UserError, match="no base_model_name_or_path"):
        load_model(str(adapter), torch.float32, CPU)
    (adapter / "adapter_model.safetensors").rename(adapter / "adapter_model.bin")
    with pytest.raises(UserError, match="not loaded: unpickling can run code"):
        load_model(str(adapter), torch.float32, CPU)


def test_fresh_adapters_name_a_portable_base():
    wrapped = lora.wrap(load_model("random:tiny", torch.float32, CPU),
                        load_config(overrides=["model.name=random:tiny", "model.lora_rank=4"]).model)
    assert wrapped.peft_config[lora.ADAPTER].base_model_name_or_path == "random:tiny"
