"""`python -m aioareal export RUN --gguf FILE [--type f16|q8_0] [--hub REPO]`: the trained policy for
llama.cpp / Ollama (one GGUF file, models/gguf_export.py) and the Hugging Face Hub.

RUN is a run directory (its latest checkpoint's `policy/`), a checkpoint directory (`step-N/`) or a
policy directory (any Hugging Face model directory). `--hub REPO` uploads the policy directory, and
the GGUF file when one is written, to a model repository; it needs `huggingface_hub` and a login.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

from ..checkpoint.atomic import POLICY_DIR, latest_checkpoint
from ..errors import UserError, guarded


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m aioareal export",
                                description="Export a trained policy as a GGUF file (llama.cpp, Ollama) or to the Hub.")
    p.add_argument("run", metavar="RUN", help="run directory (latest checkpoint), checkpoint or policy directory")
    p.add_argument("--gguf", metavar="FILE", help="write the policy as this GGUF file (llama and qwen2 models)")
    p.add_argument("--type", default="f16", choices=["f16", "q8_0"], help="GGUF weight type (default f16)")
    p.add_argument("--hub", metavar="REPO", help="upload the policy directory (and GGUF file) to this Hub repository")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    return guarded(args.debug, lambda: export(args))


def export(args: argparse.Namespace) -> int:
    if not args.gguf and not args.hub:
        raise UserError("export: nothing to do; give --gguf FILE and/or --hub REPO")
    policy = policy_dir(Path(args.run))
    if args.hub:
        hub_api()  # before a long export: say now that the upload cannot happen
    written = None
    if args.gguf:
        written = write_gguf(policy, gguf_path(args.gguf, policy, args.type), args.type)
        print(f"wrote {written} ({written.stat().st_size / 2**20:.1f} MiB, {args.type}) from {policy}")
    if args.hub:
        upload(args.hub, policy, written)
    return 0


def policy_dir(target: Path) -> Path:
    """The policy directory RUN names: a run's latest checkpoint's, a checkpoint's, or RUN itself."""
    if not target.exists():
        raise UserError(f"export: {target}: no such run, checkpoint or policy directory")
    if (target / "config.json").is_file():
        return target
    if (target / POLICY_DIR / "config.json").is_file():
        return target / POLICY_DIR
    checkpoint = latest_checkpoint(target)
    if checkpoint is not None and (checkpoint / POLICY_DIR / "config.json").is_file():
        return checkpoint / POLICY_DIR
    raise UserError(f"export: {target}: neither a run with a checkpoint (checkpoints/step-N/policy/) nor a "
                    "checkpoint or policy directory (config.json)")


def gguf_path(given: str, policy: Path, qtype: str) -> Path:
    """--gguf FILE as given; a directory (`.`, `out/`) gets NAME-step-N-TYPE.gguf inside it. Checked
    before the model loads: a folder that is not there is one line, not a traceback after the export."""
    path = Path(given)
    if path.is_dir() or given.endswith(("/", "\\")):
        path = path / f"{_model_name(policy)}-{qtype}.gguf"
    if not path.parent.is_dir():
        raise UserError(f"export --gguf {given}: no directory {path.parent} to write it in")
    if not os.access(path.parent, os.W_OK):  # a read-only mount too: else the error names the temporary file
        raise UserError(f"export --gguf {given}: directory {path.parent} is not writable")
    return path


def write_gguf(policy: Path, out: Path, qtype: str) -> Path:
    import torch
    from transformers import PreTrainedTokenizerFast

    from ..models.gguf_export import export_gguf
    from ..models.load_policy import load_model

    model = load_model(str(policy), torch.float32, torch.device("cpu"))
    try:  # tokenizer.json as saved: AutoTokenizer may rebuild it from the model type's own class
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(policy))
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"export: {policy}: no usable tokenizer.json ({first})") from None
    return export_gguf(model, tokenizer, out, qtype, name=_model_name(policy))


def _model_name(policy: Path) -> str:
    parts = policy.resolve().parts  # runs/NAME/checkpoints/step-N/policy -> NAME-step-N
    if len(parts) >= 4 and parts[-1] == POLICY_DIR and parts[-3] == "checkpoints":
        return f"{parts[-4]}-{parts[-2]}"
    return parts[-1]


def hub_api():
    """An authenticated HfApi, or a one-line error saying what is missing."""
    if importlib.util.find_spec("huggingface_hub") is None:
        raise UserError("export --hub: needs the huggingface_hub package: pip install huggingface_hub")
    import huggingface_hub

    if not huggingface_hub.get_token():
        raise UserError("export --hub: not logged in to the Hugging Face Hub: run `hf auth login` "
                        "(or set HF_TOKEN)")
    return huggingface_hub.HfApi()


def upload(repo: str, policy: Path, gguf_file: Path | None) -> None:
    api = hub_api()
    try:
        api.create_repo(repo, repo_type="model", exist_ok=True)
        api.upload_folder(repo_id=repo, folder_path=str(policy), commit_message="aioareal policy")
        if gguf_file is not None:
            api.upload_file(repo_id=repo, path_or_fileobj=str(gguf_file), path_in_repo=gguf_file.name,
                            commit_message="aioareal GGUF export")
    except Exception as e:  # noqa: BLE001 - network, auth and permission errors all end the same way
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"export --hub {repo}: upload failed ({first})") from None
    print(f"uploaded {policy}{' and ' + gguf_file.name if gguf_file else ''} to https://huggingface.co/{repo}")
