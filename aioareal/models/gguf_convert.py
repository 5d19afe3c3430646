"""One GGUF file into a plain Hugging Face directory: dequantized safetensors weights, config,
generation config and tokenizer (with the file's chat template).

A GGUF file is data (docs/architecture.md rule 10): parsed with `struct` and numpy memory maps,
nothing unpickled, no Python from the file run; the config comes from a fixed table of metadata
keys, and the chat template renders in a sandbox. Transformers is pointed at a fresh directory
holding only a link to the file, so no config.json or tokenizer file beside the user's GGUF (nor
an `auto_map` naming code) is picked up, and `trust_remote_code` stays off.
"""
from __future__ import annotations

import importlib.util
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from ..errors import UserError, one_line
from .gguf_header import check_gguf_header
from .prompt_encoding import special_prefix

PRE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # llama.cpp's pre-tokenizer names ("smollm", "llama-bpe")

REQUIRED = ("gguf", "accelerate")  # transformers' GGUF loader needs both; neither is a core dependency
INSTALL_HINT = "pip install 'aioareal[gguf]'"


def convert(path: Path, out: Path) -> None:
    """Dequantize the GGUF file at `path` into the Hugging Face directory `out` (which exists)."""
    require_packages(path)
    kept = check_gguf_header(path)  # every claimed count within the file's size, before a reader allocates
    with _alone(path) as link:
        try:
            model = AutoModelForCausalLM.from_pretrained(str(link.parent), gguf_file=str(link),
                                                         trust_remote_code=False)
            tokenizer = AutoTokenizer.from_pretrained(str(link.parent), gguf_file=str(link),
                                                      trust_remote_code=False)
        except Exception as e:  # noqa: BLE001 - each failure becomes one of the two lines below
            # A corrupt file is told apart by parsing it whole, only now: up front, a fourth parse
            # would cost every conversion (docs/log/figures-from-code.md).
            check_readable(path)
            raise UserError(f"{path}: could not convert this GGUF file ({_first_line(e)})") from None
    _as_dense(model).save_pretrained(str(out))  # safetensors, tied embeddings stored once
    _keep_tokenizer_metadata(tokenizer, kept, path)
    tokenizer.save_pretrained(str(out))


def _keep_tokenizer_metadata(tokenizer: Any, kept: dict[str, str | bool], path: Path) -> None:
    """What transformers' reader drops or may get wrong, from the file's own metadata:
    `tokenizer.ggml.pre` (llama.cpp's pre-tokenizer name), kept as `gguf_pre_tokenizer` so an export
    writes the name the model came with; `tokenizer.ggml.add_bos_token`, which the converted
    tokenizer must follow (prompt_encoding.py relies on the tokenizer's own behaviour)."""
    pre = kept.get("tokenizer.ggml.pre")
    if isinstance(pre, str) and PRE_NAME.fullmatch(pre):
        tokenizer.init_kwargs["gguf_pre_tokenizer"] = pre
    wants = kept.get("tokenizer.ggml.add_bos_token")
    bos = tokenizer.bos_token_id
    if not isinstance(wants, bool) or bos is None or (special_prefix(tokenizer) == [bos]) == wants:
        return
    tokenizer.add_bos_token = wants  # transformers rebuilds the post-processor from this flag
    if (special_prefix(tokenizer) == [bos]) != wants:
        print(one_line(f"warning: {path}: the file says tokenizer.ggml.add_bos_token={str(wants).lower()}, but its "
                       "converted tokenizer does otherwise; prompts follow the converted tokenizer"), flush=True)


def require_packages(path: Path) -> None:
    """The packages a conversion needs; a cached conversion loads without them."""
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"{path}: reading a GGUF file needs the {' and '.join(missing)} "
                        f"package{'s' if len(missing) > 1 else ''}: {INSTALL_HINT} "
                        f"(or pip install {' '.join(missing)})")


def check_readable(path: Path) -> None:
    """Parse the whole file: a corrupt one fails in one line naming it, not in a numpy reshape."""
    from gguf import GGUFReader

    try:
        GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure means the same thing: not a usable file
        raise UserError(f"{path}: not a readable GGUF file ({_first_line(e)}); it may be truncated or "
                        "corrupt: download or copy it again") from None


@contextmanager
def _alone(path: Path) -> Iterator[Path]:
    """A link to `path` in an otherwise empty temporary directory."""
    with tempfile.TemporaryDirectory(prefix="aioareal-gguf-") as folder:
        link = Path(folder) / path.name
        link.symlink_to(path.resolve())
        yield link


def _as_dense(model: PreTrainedModel) -> PreTrainedModel:
    """Drop the GGUF quantizer's marks: the weights are dense now, and the marks would stop
    `save_pretrained` (and make a reload look for the file)."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
