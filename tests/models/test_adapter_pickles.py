"""Adapter files beside a model are never unpickled (docs/reliability.md#adapters): with peft
installed, transformers loads any PEFT adapter it finds in a model directory (a checkpoint's
`policy/` included), and peft unpickles `adapter_model.bin` when there is no safetensors adapter.
Such a directory is refused in one line naming the file unless model.allow_pickle=true, even where
torch.load's weights-only guard fails (CVE-2025-32434, torch < 2.6, simulated here)."""
from __future__ import annotations

import json

import pytest
import torch

from aioareal.errors import UserError
from aioareal.models import load_model, random_model
from aioareal.models.shapes import build_char_tokenizer

peft = pytest.importorskip("peft")
CPU = torch.device("cpu")


class Payload:
    """Unpickling this creates the marker file: proof that code from the file ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def model_dir(path, adapter: str | None):
    random_model("tiny", torch.float32, CPU).save_pretrained(path)
    build_char_tokenizer().save_pretrained(path)
    if adapter is None:
        return path
    config = peft.LoraConfig(r=2, target_modules=["q_proj"], base_model_name_or_path=str(path))
    config.save_pretrained(path)
    assert json.loads((path / "adapter_config.json").read_text())["peft_type"] == "LORA"
    if adapter == "pickle":
        payload = Payload(str(path.parent / "MARKER"))
        torch.save({"base_model.model.lm_head.weight": payload}, path / "adapter_model.bin")
    else:
        peft.get_peft_model(random_model("tiny", torch.float32, CPU), config).save_pretrained(path)
    return path


@pytest.fixture
def unguarded_torch_load(monkeypatch):
    """torch.load as the weights_only bypass of CVE-2025-32434 left it: any pickle runs."""
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, weights_only=None, **k: real(*a, **{**k, "weights_only": False}))


def test_a_pickled_adapter_beside_a_model_is_refused_and_never_unpickled(tmp_path, unguarded_torch_load):
    path = model_dir(tmp_path / "model", "pickle")
    with pytest.raises(UserError) as e:
        load_model(str(path), torch.float32, CPU)
    assert str(e.value).startswith(f"model.name '{path}': {path / 'adapter_model.bin'} is a PEFT adapter in pickle "
                                   "form") and "model.allow_pickle=true" in str(e.value)
    assert not (tmp_path / "MARKER").exists()


def test_a_checkpoint_policy_with_a_pickled_adapter_is_refused(tmp_path, unguarded_torch_load):
    policy = model_dir(tmp_path / "checkpoints" / "step-000002" / "policy", "pickle")
    with pytest.raises(UserError, match="adapter_model.bin is a PEFT adapter in pickle form"):
        load_model(str(policy), torch.float32, CPU)
    assert not (tmp_path / "checkpoints" / "step-000002" / "MARKER").exists()


def test_a_safetensors_adapter_and_a_plain_model_still_load(tmp_path):
    assert load_model(str(model_dir(tmp_path / "plain", None)), torch.float32, CPU) is not None
    path = model_dir(tmp_path / "adapted", "safetensors")
    assert (path / "adapter_model.safetensors").is_file()
    assert load_model(str(path), torch.float32, CPU) is not None



FLOORS = {"torch": ("2.6", "CVE-2025-32434"), "transformers": ("5.3", "CVE-2026-4372"),
          "jinja2": ("3.1.6", "CVE-2025-27516")}


def test_dependency_floors_close_the_named_cves_and_the_installed_versions_meet_them():
    import re
    from importlib.metadata import version
    from pathlib import Path

    from packaging.version import Version

    root = Path(__file__).resolve().parents[2]
    pyproject = (root / "pyproject.toml").read_text()
    reliability = (root / "docs" / "reliability.md").read_text()
    for name, (floor, cve) in FLOORS.items():
        found = re.search(rf'^\s*"{name}>=([0-9.]+)",', pyproject, re.MULTILINE)
        assert found and Version(found.group(1)) >= Version(floor), name
        assert cve in pyproject and cve in reliability
        assert Version(version(name).split("+")[0]) >= Version(floor)


def test_a_shard_index_listing_a_pickle_is_refused_and_never_unpickled(tmp_path, unguarded_torch_load):
    """The index's own name says safetensors; the weight map it holds names a pickle shard, which
    transformers would load."""
    path = model_dir(tmp_path / "model", None)
    (path / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": Payload(str(tmp_path / "MARKER"))}, path / "model-00001.bin")
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001.bin"}}))
    with pytest.raises(UserError) as e:
        load_model(str(path), torch.float32, CPU)
    assert str(e.value).startswith(f"model.name '{path}': {path / 'model.safetensors.index.json'} lists "
                                   "model-00001.bin, which is not a safetensors file")
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("damaged", ["model.safetensors", "adapter_model.safetensors"])
def test_a_corrupt_safetensors_file_is_one_line(tmp_path, damaged):
    path = model_dir(tmp_path / "model", "safetensors")
    (path / damaged).write_bytes(b"\xff" * 64)
    with pytest.raises(UserError, match=rf"^model.name '{path}': a .safetensors file there is not readable \("):
        load_model(str(path), torch.float32, CPU)
