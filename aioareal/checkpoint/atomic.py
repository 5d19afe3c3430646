"""Checkpoints: written to a temporary directory and renamed, so a crash leaves the previous one
intact (docs/architecture.md rule 6). The policy is saved with `save_pretrained` (loads in transformers or vLLM
as is); optimizer, scheduler, RNG states and the run's counters go beside it. A LoRA run also
saves its adapter in PEFT format, and `policy/` holds the merged weights (models/lora.py).

    runs/NAME/checkpoints/step-000040/
        policy/         config.json, model.safetensors, tokenizer files
        adapter/        LoRA runs: adapter_config.json, adapter_model.safetensors (a resume loads these)
        trainer.pt      optimizer, scheduler, loss scaler, version
        rng.pt          python, torch CPU/CUDA and sampling-generator states
        state.json      step, data cursor, group ledger, elapsed time (written last)

Everything reads back without running code from the files: the policy is safetensors, state.json
is JSON, and the two .pt files hold only plain data (dicts, lists, numbers, tensors) that
`safeload.load_plain` checks before `torch.load(weights_only=True)`. A resume of a run directory
someone else produced can therefore not be made to execute anything through its checkpoints.

`own_run_dir`: one writer per run directory, an OS file lock (flock) on `RUN_LOCK` inside it, held for the run's
life (docs/reliability.md#run-directories).

The kernel drops a flock when its holder's last descriptor closes, a SIGKILL included, so a lock
left by a dead run never blocks: the file stays behind but nobody holds it. The pid written into the
file only names the holder in the error line; it is never trusted to decide anything. The
descriptor is opened close-on-exec, and reward workers are spawned, not forked, so no child keeps
the lock alive after its run has gone. Within one process the lock is counted, not retaken: a
`--resume` owns the directory from its first look at it, and the training it starts takes the
same lock again.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..distributed.world import is_collective_failure
from ..errors import DataError, UserError, one_line, reading
from ..io import atomic_write_text, loads_bounded, open_lock_file
from ..models.lora import ADAPTER_WEIGHTS, check_adapter_dir, is_lora, save_adapter, save_merged
from .safeload import UnsafeFile, check_shards, load_plain

PREFIX = "step-"
SHARDS = "shards"  # torch.distributed.checkpoint's directory in a checkpoint written by several ranks
POLICY_DIR, ADAPTER_DIR = "policy", "adapter"


@dataclass
class RunState:
    """Counters a resumed run continues from (everything else derives from `step`)."""

    step: int
    cursor: int  # prompts drawn from the training source, up to the oldest untrained group
    elapsed: float  # seconds of run time so far, so `time` in metrics.jsonl keeps increasing
    ledger: dict[str, int] = field(default_factory=dict)
    reward_failures: int = 0
    config_digest: str = ""
    # Under torchrun, each rank's own counters (cursor, ledger, reward_failures), in rank order;
    # the fields above are rank 0's. Empty for a single process (and then not written).
    ranks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return len(self.ranks) or 1


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _step_of(path: Path) -> int:
    return int(path.name[len(PREFIX):])


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a temporary directory left by a crash is not one)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()
            and (p / "state.json").is_file()]
    return sorted(done, key=_step_of)


def husks(run_dir: Path) -> list[Path]:
    """Directories named like a checkpoint that are not one: no state.json (written last, so a kill
    while an old checkpoint was removed, or a copy cut short). Real directories only: a link of that
    name is not followed, and nothing that is not named `step-N` is ever one."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()
             and not p.is_symlink() and p.is_dir() and not (p / "state.json").is_file()]
    return sorted(found, key=_step_of)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def latest_readable(run_dir: Path, log: Callable[[str], None] = print, move_aside: bool = True) -> Path | None:
    """The newest checkpoint whose files all read back. An unreadable one (a disk fault, a file
    edited by hand) is reported and renamed `broken-step-N`, kept for inspection but no longer a
    checkpoint: it must not count towards keep_checkpoints, or pruning would delete a good one.
    A reader of someone else's run (eval, chat, model.name=RUN) passes move_aside=False: it says
    which checkpoint it skipped and leaves the directory as it found it."""
    for husk in husks(run_dir):
        log(one_line(f"note: {husk} has no state.json (a checkpoint half written or half removed); ignored"
                     + (", removed at the next checkpoint" if move_aside else "")))
    for path in reversed(list_checkpoints(run_dir)):
        try:
            check_readable(path)
            return path
        except UnsafeFile:
            # Refused, not broken: moving it aside and resuming from the checkpoint before would
            # turn a planted file into a warning nobody reads and train on in a run directory that
            # someone tampered with. Stop here, name the file, and let the user decide.
            raise
        except Exception as e:  # any way a file can be broken: report it, try the previous one
            if not move_aside:
                log(one_line(f"warning: checkpoint {path} is unreadable ({type(e).__name__}: {e}); using the one "
                             "before it"))
                continue
            aside = path.with_name(f"broken-{path.name}")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(path, aside)
            log(one_line(f"warning: checkpoint {path} is unreadable ({type(e).__name__}: {e}); moved to "
                         f"{aside.name}, trying the one before it"))
    return None


def run_policy(run_dir: Path, log: Callable[[str], None] = print) -> Path:
    """The policy of a run's latest readable checkpoint: what model.name=RUN starts from (an `sft` run)."""
    latest = latest_readable(run_dir, log, move_aside=False)
    if latest is None:
        raise UserError(f"model.name={run_dir}: the run has no readable checkpoint to start from")
    log(f"model: {latest / POLICY_DIR}")
    return latest / POLICY_DIR


def broken_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints `latest_readable` found unreadable and moved aside."""
    root = checkpoint_dir(run_dir)
    return sorted(root.glob(f"broken-{PREFIX}*")) if root.is_dir() else []


def check_readable(path: Path) -> None:
    """Raise if any file of checkpoint `path` does not load."""
    from safetensors import safe_open

    load_state(path)
    load_trainer_state(path, torch.device("cpu"))
    load_rng(path)
    for other in path.glob("rng-rank*.pt"):  # the other ranks' of a checkpoint written under torchrun
        load_plain(other)
    if (path / SHARDS).is_dir():  # their model and optimizer shards: metadata safe, files whole
        check_shards(path / SHARDS)
    weights = sorted((path / POLICY_DIR).glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"no *.safetensors under {path / POLICY_DIR}")
    if (path / ADAPTER_DIR).exists():
        check_adapter_dir(path / ADAPTER_DIR)
        weights.append(path / ADAPTER_DIR / ADAPTER_WEIGHTS)
    for file in weights:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                f.get_slice(key)  # reads the header entry; a truncated file fails here or in safe_open


def rng_state(engine_generator: torch.Generator | None) -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if engine_generator is not None:
        state["engine"] = engine_generator.get_state()
    return state


def restore_rng(state: dict[str, Any], engine_generator: torch.Generator | None) -> None:
    # random.setstate wants (version, tuple of 625 ints, gauss_next); accept the inner state as a
    # list too, the form it takes once it has been through any plain format other than pickle.
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if engine_generator is not None and "engine" in state:
        engine_generator.set_state(state["engine"])


def save(run_dir: Path, state: RunState, model: Any, tokenizer: Any, trainer_state: dict[str, Any],
         rng: dict[str, Any], keep: int) -> Path:
    """Write checkpoint `step-<state.step>` atomically, then drop all but the newest `keep`."""
    with cleaned_on_failure(temp_dir(run_dir, state.step), state.step):
        tmp = begin(run_dir, state.step)
        write_policy(tmp, model, tokenizer, trainer_state)
        torch.save(rng, tmp / "rng.pt")
        return commit(run_dir, tmp, state, keep)


@contextlib.contextmanager
def cleaned_on_failure(tmp: Path, step: int) -> Iterator[None]:
    """Any failure while checkpoint `step` is written removes its temporary directory (no husk left
    on a full disk); an error becomes one line (a full disk, a run directory made read-only: torch
    and safetensors report these as RuntimeErrors), the previous checkpoint untouched."""
    try:
        yield
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, UserError) or is_collective_failure(e):  # a peer rank gone: the caller names it
            raise
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise UserError(f"checkpoint step {step} could not be written under {tmp.parent} ({type(e).__name__}: "
                        f"{reason}); the previous checkpoint is intact") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def temp_dir(run_dir: Path, step: int) -> Path:
    """Where checkpoint `step` is written before `commit` renames it into place."""
    return checkpoint_dir(run_dir) / f".{PREFIX}{step:06d}.tmp"


def begin(run_dir: Path, step: int) -> Path:
    """An empty temporary directory for checkpoint `step` (what a crash left there is removed)."""
    tmp = temp_dir(run_dir, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def write_policy(tmp: Path, model: Any, tokenizer: Any, trainer_state: dict[str, Any]) -> None:
    """The policy in Hugging Face format (merged, with LoRA: plus the adapter in PEFT format)."""
    if is_lora(model):
        save_adapter(model, tmp / ADAPTER_DIR)
        save_merged(model, tmp / POLICY_DIR)
    else:
        model.save_pretrained(tmp / POLICY_DIR, safe_serialization=True)
    tokenizer.save_pretrained(tmp / POLICY_DIR)
    torch.save(trainer_state, tmp / "trainer.pt")


def commit(run_dir: Path, tmp: Path, state: RunState, keep: int) -> Path:
    """Write state.json last, then publish `tmp` under its final name by one rename."""
    root = checkpoint_dir(run_dir)
    final = root / f"{PREFIX}{state.step:06d}"
    fields = {k: v for k, v in asdict(state).items() if k != "ranks" or v}
    atomic_write_text(tmp / "state.json", json.dumps(fields, indent=2))
    _fsync_tree(tmp)  # contents on disk before the rename publishes them: a power cut leaves no husk
    shutil.rmtree(final, ignore_errors=True)  # a checkpoint of the same step from an earlier attempt
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(run_dir)[:-keep]:
        if not old.is_symlink():  # state.json first: a kill mid-removal leaves a husk, never a broken one
            (old / "state.json").unlink(missing_ok=True)
        shutil.rmtree(old, ignore_errors=True)  # a link is refused, not followed
    for husk in husks(run_dir):
        shutil.rmtree(husk, ignore_errors=True)
    return final


# -- state.json --------------------------------------------------------------------------------------
# Read as JSON, never code, and every field of the type the run wrote, so a hand-edited or corrupted
# file is one line naming it, never a traceback mid-resume (docs/reliability.md#bad-input-and-terminal-output).

def _count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


STATE_FIELDS: dict[str, Callable[[Any], bool]] = {
    "step": _count, "cursor": _count, "reward_failures": _count,
    "elapsed": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0,
    "ledger": lambda x: isinstance(x, dict) and all(_count(v) for v in x.values()),
    "config_digest": lambda x: isinstance(x, str),
    "ranks": lambda x: isinstance(x, list) and all(isinstance(r, dict) for r in x),
}
REQUIRED = ("step", "cursor", "elapsed")


def read_state_fields(file: Path) -> dict[str, Any]:
    """The fields of a RunState from `file`, each checked for its type; a DataError otherwise."""
    with reading(file, "the JSON object a checkpoint writes"):
        fields = loads_bounded(file.read_text(encoding="utf-8"))
    if not isinstance(fields, dict):
        raise DataError(f"{file}: expected a JSON object, got {type(fields).__name__}")
    unknown = sorted(set(fields) - set(STATE_FIELDS))
    missing = [name for name in REQUIRED if name not in fields]
    if unknown or missing:
        raise DataError(f"{file}: " + (f"unknown fields {unknown}" if unknown else f"missing fields {missing}"))
    for name, ok in STATE_FIELDS.items():
        if name in fields and not ok(fields[name]):
            raise DataError(f"{file}: field '{name}' has the wrong type or sign ({fields[name]!r:.60})")
    return fields


def load_state(path: Path) -> RunState:
    """The run's counters from `path`/state.json; a hand-edited or corrupted file is a DataError
    naming it (a resume then treats the checkpoint as unreadable)."""
    return RunState(**read_state_fields(path / "state.json"))


def load_trainer_state(path: Path, device: torch.device) -> dict[str, Any]:
    return load_plain(path / "trainer.pt", map_location=device)


def load_rng(path: Path) -> dict[str, Any]:
    return load_plain(path / "rng.pt")


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):  # files before the directories holding them
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        else:
            _fsync_dir(path)
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- restore and the finished marker --------------------------------------------------------------
DONE_FILE = "DONE"  # written when a run has trained all its steps; sweeps skip such runs
SFT_MARKER = "SFT"  # in an sft run's directory: `sft --resume` continues only these, an RL resume refuses them


def mark_done(run_dir: Path, step: int) -> None:
    atomic_write_text(Path(run_dir) / DONE_FILE, f"{step}\n")


def is_done(run_dir: Path) -> bool:
    return (Path(run_dir) / DONE_FILE).exists()


def clear_done(run_dir: Path) -> None:
    (Path(run_dir) / DONE_FILE).unlink(missing_ok=True)


def restore(path: Path, trainer: Any, engine: Any) -> RunState:
    """Continue from checkpoint `path`: the trainer's optimizer, schedule and version, the engine's
    version, every RNG. (The policy weights were loaded from `path / "policy"` when the models
    were built; the weight sync starts at the trainer's version.) Returns the run's counters."""
    state = load_state(path)
    trainer.load_state_dict(load_trainer_state(path, trainer.device))
    engine.version = state.step
    restore_rng(load_rng(path), engine.generator)
    return state


RUN_LOCK = ".lock"

_held: dict[Path, tuple[int, int]] = {}  # resolved run dir -> (descriptor, times taken)


def own_run_dir(run_dir: Path, flag: str = "--run-dir") -> None:
    """Take the run directory's lock (creating the directory), or raise a one-line UserError naming
    it and the pid of the live process that holds it (`flag`: the option that chose the directory)."""
    key = Path(run_dir).resolve()
    if key in _held:
        fd, count = _held[key]
        _held[key] = (fd, count + 1)
        return
    try:
        key.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{run_dir}: cannot create the {flag} directory ({e.strerror})") from None
    fd = open_lock_file(key / RUN_LOCK)  # a planted link, FIFO or folder is refused, never followed
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = _holder(fd)
        os.close(fd)
        raise UserError(f"{run_dir} is in use by another run or evaluation{holder}; wait for it to end, or "
                        f"choose another {flag}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held[key] = (fd, 1)


def release_run_dir(run_dir: Path) -> None:
    """Give back one taking of the lock; the last one closes the descriptor, which frees it."""
    key = Path(run_dir).resolve()
    if key not in _held:
        return
    fd, count = _held.pop(key)
    if count > 1:
        _held[key] = (fd, count - 1)
    else:
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {text})" if text.isdigit() else ""


HUSK_FILES = ("config.yaml", RUN_LOCK, "metrics.jsonl", "samples.jsonl", "eval_samples.jsonl")


def remove_husk(run_dir: Path) -> bool:
    """After a fresh run failed before its first step: remove what its start wrote (config.yaml, the
    lock, empty logs) and the directory if nothing else is in it, so a failed start leaves no run
    behind for `plot`, `eval` or the next `--resume` to trip on. Anything else (a checkpoint, a row
    of metrics, a user's file) keeps the directory as it is. True if the directory went. Called while
    the lock is still held (once), so no other run can take the lock of a file about to go."""
    held = _held.get(Path(run_dir).resolve())
    if held is None or held[1] != 1 or not run_dir.is_dir() or any(run_dir.glob("checkpoints/step-*")):
        return False
    logs = [run_dir / name for name in HUSK_FILES[2:]]
    if any(p.is_file() and p.stat().st_size > 0 for p in logs):
        return False
    for name in HUSK_FILES:
        path = run_dir / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
    for sub in ("checkpoints",):
        with contextlib.suppress(OSError):
            (run_dir / sub).rmdir()  # only if empty
    try:
        run_dir.rmdir()  # only if empty: never a file we did not write
    except OSError:
        return False
    return True
