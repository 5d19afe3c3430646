"""Load a policy model and tokenizer from a hub name, a local path, a named random shape, or a
GGUF file or named offline model (converted once to a cached safetensors directory: gguf.py).
Every path ends in `AutoModelForCausalLM`, so tests exercise the code real models use.

Weights load from safetensors only, unless `model.allow_pickle` (unpickling can run code): local
pickles are refused up front naming the file, hub ones by transformers (`use_safetensors=True`);
`trust_remote_code` is off unless the config turns it on (docs/reliability.md#security, #adapters).
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from ..errors import UserError
from . import lora
from .gguf import cached_gguf, gguf_file
from .local_names import check_hub, check_local, is_local_name
from .lora import adapter_dir, base_name, copy_side_files
from .lora import cached as cached_merge
from .named import named_gguf
from .ops import ATTENTION
from .shapes import RANDOM_PREFIX, SHAPES, build_char_tokenizer, shape_config, vocab_size_padded

try:  # progress bars from weight loading would garble the dashboard and the logs
    from transformers.utils import logging as _hf_logging

    _hf_logging.disable_progress_bar()
except ImportError:  # pragma: no cover - older transformers
    pass

MAX_INDEX_BYTES = 64 << 20  # a shard index lists tensor names: megabytes even for the largest models
ALLOW_PICKLE_HINT = ("loading pickle weights (*.bin) can run code hidden in them, so it needs "
                     "model.allow_pickle=true: set it only for a model you trust, or convert the weights to "
                     "safetensors with save_pretrained")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> bf16 on CUDA with bf16 support, fp16 on older CUDA (V100), fp32 on CPU."""
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, Any]:
    # transformers 5 renamed `torch_dtype` to `dtype`.
    params = inspect.signature(PreTrainedModel.from_pretrained).parameters
    return {"dtype": dtype} if "dtype" in params or _major_version() >= 5 else {"torch_dtype": dtype}


def _major_version() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def resolve_source(name: str) -> str:
    """What transformers loads for `name`: a named offline model or a GGUF file their converted,
    cached safetensors directory (gguf.py); a LoRA adapter directory its base with the adapter merged
    (models/lora.py); any other name itself."""
    source = named_gguf(name) or gguf_file(name)
    if source:
        return str(cached_gguf(source))
    adapter = adapter_dir(name)
    if adapter is None:
        return name
    base = resolve_source(base_name(adapter))
    return str(cached_merge(adapter, base, lambda out: _write_merged(base, adapter, out)))


def _write_merged(base: str, adapter: Path, out: Path) -> None:
    """The base in fp32 with `adapter` merged, saved in Hugging Face format with the base's tokenizer."""
    peft = lora.wrap(load_model(base, torch.float32, torch.device("cpu")), None, adapter)
    lora.save_merged(peft.get_base_model(), out)
    if Path(base).is_dir():
        copy_side_files(Path(base), out)
    else:
        load_tokenizer(base).save_pretrained(out)


def load_tokenizer(name: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    if name.startswith(RANDOM_PREFIX):
        return build_char_tokenizer()
    name = resolve_source(name)
    check_local(name)
    if not is_local_name(name):
        check_hub(name)
    try:
        loader = PreTrainedTokenizerFast if _saved_as_is(name) else AutoTokenizer
        tokenizer = loader.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise UserError(f"model.name '{name}': could not load its tokenizer ({_first_line(e)})") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _saved_as_is(name: str) -> bool:
    """A local tokenizer saved as a plain tokenizer.json (the character tokenizer, a converted GGUF's),
    which AutoTokenizer would rebuild as the model type's class, losing its pre-tokenizer."""
    path = Path(name)
    config = path / "tokenizer_config.json"
    if not (config.is_file() and (path / "tokenizer.json").is_file()):
        return False
    try:
        saved_class = json.loads(config.read_text()).get("tokenizer_class")
    except (ValueError, AttributeError):
        return False
    return saved_class in ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_model(name: str, dtype: torch.dtype, device: torch.device, trust_remote_code: bool = False,
               seed: int = 0, allow_pickle: bool = False) -> PreTrainedModel:
    """A causal LM on `device` in `dtype`; `random:<shape>` builds one with random weights."""
    if name.startswith(RANDOM_PREFIX):
        return random_model(name[len(RANDOM_PREFIX):], dtype, device, seed)
    name = resolve_source(name)
    check_local(name)
    if not is_local_name(name):
        check_hub(name)
    if not allow_pickle:
        _refuse_pickle_only(name)
        _refuse_pickle_shards(name)
        _refuse_pickle_adapter(name)
    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)  # read once, used twice
        known: dict[str, Any] = {"config": config, "attn_implementation": attention_for(config)}
    except (OSError, ValueError, KeyError):  # an adapter-only directory, or what from_pretrained reports below
        known = {"attn_implementation": ATTENTION}
    try:
        # None, not False: with pickles allowed transformers still prefers safetensors when both exist.
        model = AutoModelForCausalLM.from_pretrained(
            name, trust_remote_code=trust_remote_code, use_safetensors=None if allow_pickle else True,
            **known, **_dtype_kwarg(dtype))
    except SafetensorError as e:  # a truncated or corrupt weights file
        raise UserError(f"model.name '{name}': a .safetensors file there is not readable ({_first_line(e)})") from None
    except (OSError, ValueError, KeyError) as e:
        # A hub repository without safetensors ends up here (a local directory was checked above).
        hub_pickles = not allow_pickle and "safetensors" in str(e) and not is_local_name(name)
        hint = f"; {ALLOW_PICKLE_HINT}" if hub_pickles else ""
        raise UserError(f"model.name '{name}': could not load the model ({_first_line(e)}){hint}") from None
    return model.to(device)


def attention_for(config: Any) -> str:
    """The project's attention (models/ops.py) for model classes built on transformers'
    attention interface; the others (Falcon, MPT, Bloom) load with SDPA or eager attention."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if model_class is None or getattr(model_class, "_supports_attention_backend", True):
        return ATTENTION
    return "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"


def random_model(shape: str, dtype: torch.dtype, device: torch.device, seed: int = 0, *,
                 build_on_device: bool = False) -> PreTrainedModel:
    """A model of a named shape with random weights, drawn on the CPU so the same seed gives the same
    weights on any device. `build_on_device` draws them on `device` (the same weights on that device
    only), sparing a GPU bench the host's initialization (docs/log/2026-11-h200-session.md)."""
    if shape not in SHAPES:
        raise UserError(f"model.name 'random:{shape}': unknown shape (known: {', '.join(SHAPES)})")
    tokenizer = build_char_tokenizer()
    config = shape_config(shape, vocab_size_padded(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    config._attn_implementation = ATTENTION
    where = device if build_on_device else torch.device("cpu")
    with torch.random.fork_rng(devices=[where] if where.type == "cuda" else []), torch.device(where):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, **_dtype_kwarg(dtype))
    return model.to(device)


# Chat end-of-turn tokens (ChatML, Gemma, Llama 3, Phi-3): not always the tokenizer's EOS (Gemma 3's is <eos>).
END_OF_TURN = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>")


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every token that ends a completion: the tokenizer's EOS, the model's, and chat end-of-turn."""
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if source is not None:
            ids.update(source if isinstance(source, (list, tuple)) else [source])
    vocab = tokenizer.get_vocab()
    ids.update(vocab[token] for token in END_OF_TURN if token in vocab)
    if not ids:
        raise UserError("the tokenizer and model define no end-of-sequence token; set one in the tokenizer config")
    return sorted(ids)


def _refuse_pickle_only(name: str) -> None:
    """A local model directory with pickle weights but no safetensors is an error naming the file."""
    path = Path(name).expanduser()
    if not path.is_dir() or any(path.glob("*.safetensors")):
        return
    # The names transformers loads pickle weights from; other .bin files (training_args.bin) are never loaded.
    pickles = sorted(path.glob("pytorch_model*.bin")) + sorted(path.glob("pytorch_model*.bin.index.json"))
    if pickles:
        raise UserError(f"model.name '{name}': {pickles[0]} holds pickle weights and there is no *.safetensors "
                        f"beside it; {ALLOW_PICKLE_HINT}")


def _refuse_pickle_shards(name: str) -> None:
    """A shard index (`*.index.json`) whose weight map names a file that is not safetensors: transformers
    loads the shards it lists, whatever the index's own name says, so a pickle listed there is refused."""
    path = Path(name).expanduser()
    if not path.is_dir():
        return
    for index in sorted(path.glob("*.index.json")):
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise UserError(f"model.name '{name}': {index} is {index.stat().st_size} bytes, too large for a shard "
                            f"index (at most {MAX_INDEX_BYTES})")
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (ValueError, AttributeError, TypeError, RecursionError):
            raise UserError(f"model.name '{name}': {index} is not a shard index (a JSON object with a "
                            "weight_map of tensor names to files)") from None
        pickles = sorted(str(f) for f in shards if not str(f).endswith(".safetensors"))
        if pickles:
            raise UserError(f"model.name '{name}': {index} lists {pickles[0]}, which is not a safetensors file "
                            f"(pickle weights); {ALLOW_PICKLE_HINT}")


def _refuse_pickle_adapter(name: str) -> None:
    """A local directory with a PEFT adapter whose weights are only a pickle is an error naming the
    file: transformers loads any adapter beside a model through peft, which unpickles
    `adapter_model.bin` when no safetensors is there (docs/reliability.md#adapters)."""
    path = Path(name).expanduser()
    if not (path / "adapter_config.json").is_file() or (path / "adapter_model.safetensors").exists():
        return
    pickles = sorted(path.glob("adapter_model*.bin")) + sorted(path.glob("adapter_model*.pt"))
    if pickles:
        raise UserError(f"model.name '{name}': {pickles[0]} is a PEFT adapter in pickle form, which transformers "
                        f"would load onto the model; {ALLOW_PICKLE_HINT}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def checkpoint_activations(model: PreTrainedModel) -> None:
    """model.gradient_checkpointing, by transformers' current name where it has one (the old warns)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
