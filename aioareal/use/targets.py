"""What a TARGET on the command line names, and the config an evaluation of it reads.

  a run directory        (config.yaml + checkpoints/): its latest readable checkpoint's policy/
  a checkpoint directory (holds policy/, e.g. RUN/checkpoints/step-000400): its policy/
  anything else          a model as model.name takes it: tiny (the warm-started tiny model),
                         smollm2-135m-instruct, gemma3-270m, a Hugging Face directory or hub name, a .gguf file

The data keys (data.task, data.eval_path, data.eval_split, data.eval_size, data.chat_template,
data.system_prompt, ...) come from the first run among the targets (its config.yaml), or from
--config, with key=value overrides on top, as in training."""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from .. import checkpoint
from ..config import Config, load_config
from ..errors import UserError, one_line
from ..models.local_names import is_local_name
from ..run.build import model_path

RUN_CONFIG = "config.yaml"


@dataclass(frozen=True)
class Target:
    label: str  # as the user wrote it: the table's column, eval.jsonl's `target`
    model: str  # what load_model reads: a policy directory or a model name
    run_config: Path | None = None  # config.yaml of the run it belongs to
    named: bool = False  # a model name (tiny, smollm2-..., a hub name): resolved against the config


def resolve(arg: str) -> Target:
    path = Path(arg)
    if path.is_dir() and (path / RUN_CONFIG).is_file():
        latest = checkpoint.latest_readable(path, log=lambda line: print(one_line(line), file=sys.stderr),
                                            move_aside=False)
        if latest is None:
            raise UserError(f"{arg}: the run has no checkpoint yet (it writes one every run.checkpoint_every "
                            "steps and at its end)")
        return Target(arg, str(latest / checkpoint.POLICY_DIR), path / RUN_CONFIG)
    if path.is_dir() and (path / checkpoint.POLICY_DIR).is_dir():
        run_config = path.parent.parent / RUN_CONFIG  # RUN/checkpoints/step-N
        return Target(arg, str(path / checkpoint.POLICY_DIR), run_config if run_config.is_file() else None)
    if path.suffix == ".gguf" and not path.is_file():
        raise UserError(f"{arg}: no such GGUF file")
    if is_local_name(arg) and not path.expanduser().exists():
        # A path, not a hub name (owner/name): said before any target is evaluated, not after.
        raise UserError(f"{arg}: no such run, checkpoint or model directory")
    return Target(arg, arg, named=not path.exists())


def target_config(targets: list[Target], config_file: str | None, overrides: list[str]) -> tuple[Config, Config]:
    """The first run's config (or --config, or the defaults) with the overrides, and without them: a
    `tiny` target is the warm-start the run began from, whose cache key holds data keys (data.eval_size)
    that an evaluation may override."""
    base = config_file or next((str(t.run_config) for t in targets if t.run_config), None)
    return load_config(base, overrides), load_config(base)


def model_source(target: Target, start: Config, log=print) -> str:
    """The path or name to load for `target` (tiny: the warm-start of `start`, the run's config
    before overrides; trained once if not cached)."""
    if target.named and target.model == "tiny":
        return model_path(replace(start, model=replace(start.model, name="tiny")), log)
    return target.model
