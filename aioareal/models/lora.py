"""LoRA training through peft (extra `aioareal[lora]`): only rank-r adapters train, the base stays
frozen (docs/architecture.md#lora-part-by-part). `wrap` injects the adapters and the trainer keeps
the injected HF model; `AdaptersOff` is the KL reference; `merged_weight` is what the generator
receives (weightsync/full.py); `save_adapter` and `save_merged` write the checkpoint's two
forms. peft is imported only when a run asks for LoRA: it takes seconds to import.

`adapter_dir`, `cached`, `base_name`: a LoRA adapter directory loaded as a model, its base with the
adapter merged in, built once into a cache.

`model.name=DIR`, where DIR holds PEFT's two files (what a LoRA checkpoint keeps under adapter/, what
PEFT and TRL save), loads as its base with `W + (alpha / r) * B @ A` merged into each adapted matrix,
so every loader reads it as any Hugging Face model. The base is the adapter config's
`base_model_name_or_path` (a relative path taken from the adapter's directory when it exists there).
Entries live in `<cache root>/adapters/<digest>/`, keyed by the adapter's bytes and the base, built
and renamed into place under a file lock as gguf.py does.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from ..config import ModelConfig
from ..errors import UserError
from ..io import exclusive_lock
from .gguf import KEY_DIGITS, cache_root, file_digest
from .named import NAMED
from .shapes import RANDOM_PREFIX

ADAPTER = "default"  # peft's name for the one adapter a run trains
PEFT_PREFIX = "base_model.model."  # where PeftModel keeps the HF model: its adapter files use these names


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise UserError("model.lora_rank > 0 needs the 'peft' package: pip install 'aioareal[lora]'") from None
    return peft


def is_lora(model: nn.Module) -> bool:
    """Whether `model` carries peft adapters (peft copies its config onto the injected model)."""
    return bool(getattr(model, "peft_config", None))


def wrap(model: PreTrainedModel, config: ModelConfig | None, adapter_dir: Path | None = None) -> Any:
    """Freeze `model` and add LoRA adapters: fresh ones (B = 0, so the policy starts as the base) shaped
    by `config`, or those a checkpoint saved in `adapter_dir`. Returns the PeftModel."""
    peft = _peft()
    with warnings.catch_warnings():  # peft calls a transformers method transformers has since renamed
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return _wrap(peft, model, config, adapter_dir)


def _wrap(peft: Any, model: PreTrainedModel, config: ModelConfig | None, adapter_dir: Path | None) -> Any:
    if adapter_dir is not None or config is None:
        return peft.PeftModel.from_pretrained(model, str(adapter_dir), adapter_name=ADAPTER, is_trainable=True)
    present = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    missing = [t for t in config.lora_targets if t not in present]
    if missing:
        raise UserError(f"config key 'model.lora_targets': the model has no Linear module named {missing[0]!r}; "
                        f"it has {', '.join(sorted(present))}")
    lora = peft.LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                           target_modules=list(config.lora_targets), bias="none")
    wrapped = peft.get_peft_model(model, lora, adapter_name=ADAPTER)
    if portable_name(config.name):  # saved adapters name their base as the run did, not by a cache path
        wrapped.peft_config[ADAPTER].base_model_name_or_path = config.name
    return wrapped


def portable_name(name: str) -> bool:
    """Whether model.name loads the same model on another machine (a named or random model, an adapter
    directory), not a cache path."""
    return name in NAMED or name.startswith(RANDOM_PREFIX) or adapter_dir(name) is not None


class AdaptersOff:
    """The KL reference as the trainer calls it (`.model(...)`, `.lm_head`): the policy with its
    adapters switched off."""

    def __init__(self, peft_model: Any) -> None:
        self.peft = peft_model
        self.inner: PreTrainedModel = peft_model.get_base_model()
        self.lm_head = self.inner.lm_head  # never adapted: the targets are the blocks' projections

    def model(self, **inputs: Any) -> Any:
        # Only the trainer's thread runs these modules, so switching the adapters off races with nothing.
        with self.peft.disable_adapter():
            return self.inner.model(**inputs)


def adapted_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every adapted Linear, named as in the plain model (`...self_attn.q_proj`)."""
    return [(name, m) for name, m in model.named_modules() if hasattr(m, "base_layer") and hasattr(m, "lora_A")
            and ADAPTER in m.lora_A]


@torch.no_grad()
def merged_weight(module: nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """W + (alpha / r) * B @ A of one adapted Linear, summed in fp32 (W may be bf16), cast to `dtype`."""
    delta = module.get_delta_weight(ADAPTER)  # (out, in): peft's own scaling and layout
    return (module.base_layer.weight.float() + delta.float()).to(dtype)


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The policy as a plain HF state dict on the CPU: adapted weights merged (in the base's dtype),
    adapter tensors dropped, peft's `.base_layer` names back to the model's own."""
    merged = {f"{name}.weight": merged_weight(m, m.base_layer.weight.dtype).cpu()
              for name, m in adapted_modules(model)}
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        out[key] = merged.get(key, value.detach().cpu())
    return out


def save_merged(model: PreTrainedModel, path: Path) -> None:
    """The merged policy in Hugging Face format (loads with AutoModelForCausalLM, or in vLLM)."""
    model.save_pretrained(path, state_dict=merged_state_dict(model), safe_serialization=True)


def save_adapter(model: nn.Module, path: Path) -> None:
    """The adapter in PEFT format: the files `PeftModel.save_pretrained` writes, under its names."""
    from safetensors.torch import save_file

    peft = _peft()
    state = peft.get_peft_model_state_dict(model, adapter_name=ADAPTER, save_embedding_layers=False)
    path.mkdir(parents=True, exist_ok=True)
    save_file({PEFT_PREFIX + k: v.detach().cpu().contiguous() for k, v in state.items()}, str(path / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})
    model.peft_config[ADAPTER].save_pretrained(str(path))


def trainable_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def describe(model: nn.Module) -> str:
    trainable, total = trainable_parameters(model)
    names = sorted({name.rsplit(".", 1)[-1] for name, _ in adapted_modules(model)})
    return (f"LoRA: training {trainable:,} of {total:,} parameters ({100 * trainable / total:.1f}%), adapters on "
            f"{len(adapted_modules(model))} matrices ({', '.join(names)})")


def check_adapter_dir(path: Path) -> None:
    """A checkpoint's adapter must be safetensors: peft would unpickle a `.bin` adapter in its place."""
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (path / name).is_file():
            raise FileNotFoundError(f"no {name} under {path}")


def decoder(model: Any) -> Any:
    """What maps input ids to the last hidden states (a module, or AdaptersOff's `model` method)."""
    return model.model if hasattr(model, "model") else model.base_model


ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"  # PEFT's names
MANIFEST = "aioareal-adapter.json"  # written last inside an entry
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def adapter_dir(name: str) -> Path | None:
    """The adapter directory `name` points to, or None (a model directory, a file, a hub name)."""
    path = Path(name).expanduser()
    if not (path / ADAPTER_CONFIG).is_file() or (path / "config.json").exists():
        return None
    if not (path / ADAPTER_WEIGHTS).is_file():
        raise UserError(f"model.name '{name}': an adapter directory without {ADAPTER_WEIGHTS} (a pickled "
                        "adapter_model.bin is not loaded: unpickling can run code)")
    return path


def base_name(adapter: Path) -> str:
    """The model `adapter` was trained on, as its config names it."""
    try:
        config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{adapter / ADAPTER_CONFIG}: not a readable JSON adapter config ({e})") from None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base.strip():
        raise UserError(f"{adapter / ADAPTER_CONFIG}: no base_model_name_or_path; set it to the model the "
                        "adapter was trained on")
    beside = adapter / base
    return str(beside) if not Path(base).is_absolute() and beside.exists() else base


def cached(adapter: Path, base: str, build: Callable[[Path], None]) -> Path:
    """The merged directory of `adapter` over the resolved `base`, made by `build(tmp)` when absent."""
    sha = hashlib.sha256(base.encode())
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        sha.update(file_digest(adapter / name).encode())
    digest = sha.hexdigest()
    entry = cache_root() / "adapters" / digest[:KEY_DIGITS]
    if _complete(entry, digest):
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(entry.parent / f".{entry.name}.lock"):
        if _complete(entry, digest):
            return entry
        print(f"merging adapter {adapter} into {base} once, into {entry}", flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
        try:
            build(tmp)
            (tmp / MANIFEST).write_text(json.dumps({"adapter": str(adapter.resolve()), "base": base,
                                                    "sha256": digest}, indent=2) + "\n")
            if entry.exists():
                shutil.rmtree(entry)
            os.rename(tmp, entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def copy_side_files(base: Path, out: Path) -> None:
    """The base directory's tokenizer, chat template and generation config, copied as they are."""
    for f in base.iterdir():
        skip = f.name.endswith(WEIGHT_SUFFIXES) or f.name.endswith(".index.json") or f.name.startswith("aioareal-")
        if f.is_file() and not skip and not (out / f.name).exists():
            shutil.copyfile(f, out / f.name)


def _complete(entry: Path, digest: str) -> bool:
    try:
        return json.loads((entry / MANIFEST).read_text()).get("sha256") == digest
    except (OSError, ValueError, AttributeError):
        return False
