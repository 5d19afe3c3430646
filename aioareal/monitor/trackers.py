"""Experiment trackers (`run.trackers=tensorboard,wandb,trackio`): the metrics.jsonl rows, mirrored.

`metrics.jsonl` stays the source of truth; a tracker is a copy for the tools people already use.
The per-step hook hands each row to `TrackerFeed.log`, which only puts it on a bounded queue: a
background thread opens the trackers (each logs the resolved config once), logs every numeric
value of every row at the row's step, and closes them at the end. So a slow tracker (W&B starting
its service, a network hiccup) never blocks the event loop, and a tracker that raises is reported
once and dropped while the run and the other trackers go on. A full queue drops rows and counts
them (`dropped`) rather than wait.

TensorBoard writes `runs/NAME/tensorboard/` through `torch.utils.tensorboard` (extra
`aioareal[tensorboard]`). W&B (`aioareal[wandb]`) runs offline by default into `runs/NAME/wandb/`
(`run.wandb_mode=online` uploads as it goes; `wandb sync` uploads an offline run later). trackio
(`aioareal[trackio]`) is local-first: a SQLite database under `$TRACKIO_DIR` (default
`~/.cache/huggingface/trackio`), viewed with `trackio show`. A tracker whose package is missing is
an error up front, naming the package.
"""
from __future__ import annotations

import hashlib
import importlib.util
import math
import queue
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import yaml

from ..config import RunConfig
from ..errors import UserError, one_line

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}  # tracker -> package
QUEUE_ROWS = 4096  # rows waiting for the thread; more than a long run's worth of bursts
_STOP = object()


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The row's numbers, as trackers take them: finite ints and floats, `step` aside (it is the x axis)."""
    return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)}


class TensorBoard:
    def __init__(self, run_dir: Path, settings: RunConfig, recorded: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        text = yaml.safe_dump(recorded, sort_keys=False, default_flow_style=None)
        self.writer.add_text("config", "```yaml\n" + text + "```", 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


def _run_id(run_dir: Path) -> str:
    # Stable across resumes of one run directory, distinct for two directories of the same name.
    return f"{run_dir.name}-{hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]}"


class WandB:
    def __init__(self, run_dir: Path, settings: RunConfig, recorded: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project=settings.tracker_project, name=run_dir.name, id=_run_id(run_dir),
                              resume="allow", dir=str(run_dir), mode=settings.wandb_mode, config=recorded)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackio:
    RENAMED = {"time": "elapsed_s"}  # trackio reserves `time` (and renames it itself, with a warning each row)

    def __init__(self, run_dir: Path, settings: RunConfig, recorded: dict[str, Any]) -> None:
        import trackio

        self.run = trackio.init(project=settings.tracker_project, name=_run_id(run_dir), config=recorded,
                                resume="allow")

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({self.RENAMED.get(k, k): v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


OPENERS: dict[str, Callable[[Path, RunConfig, dict[str, Any]], Tracker]] = {
    "tensorboard": TensorBoard, "wandb": WandB, "trackio": Trackio}


def check_installed(names: list[str]) -> None:
    """A tracker whose package is missing is a config error up front, not a warning mid-run."""
    for name in names:
        package = PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise UserError(f"config key 'run.trackers': '{name}' needs the '{package}' package, which is not "
                            f"installed: pip install 'aioareal[{name}]'")


def _warn(message: str) -> None:
    print(one_line(f"warning: {message}"), file=sys.stderr, flush=True)


class TrackerFeed:
    """The trackers of one run behind a bounded queue and one background thread."""

    def __init__(self, openers: dict[str, Callable[[], Tracker]], warn: Callable[[str], None] = _warn,
                 maxsize: int = QUEUE_ROWS) -> None:
        self.openers, self.warn = openers, warn
        self.queue: queue.Queue = queue.Queue(maxsize)
        self.failed: dict[str, str] = {}  # tracker -> the error that dropped it
        self.dropped = 0  # rows the full queue turned away
        self.thread = threading.Thread(target=self._run, name="trackers", daemon=True) if openers else None
        if self.thread:
            self.thread.start()

    def log(self, row: dict[str, Any]) -> None:
        """Called on the event loop's thread: enqueue and return, never wait."""
        if self.thread is None:
            return
        try:
            self.queue.put_nowait(row)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                self.warn("trackers fall behind; rows are being dropped from them (metrics.jsonl has every row)")

    def close(self, timeout: float = 60.0) -> None:
        """Flush the queued rows and close every tracker (waits at most `timeout` seconds)."""
        if self.thread is None:
            return
        try:
            self.queue.put(_STOP, timeout=timeout)
        except queue.Full:
            self.warn("trackers did not drain their queue in time; closing without the last rows")
        self.thread.join(timeout)

    def _drop(self, name: str, what: str, error: BaseException) -> None:
        self.failed[name] = f"{type(error).__name__}: {error}"
        self.warn(f"tracker {name} failed to {what} ({self.failed[name]}); it is dropped, the run goes on")

    def _run(self) -> None:
        live: dict[str, Tracker] = {}
        for name, opener in self.openers.items():
            try:
                live[name] = opener()
            except Exception as e:  # any failure of a tracker is its own, never the run's
                self._drop(name, "start", e)
        while (row := self.queue.get()) is not _STOP:
            metrics, step = scalars(row), int(row.get("step", 0))
            for name, tracker in list(live.items()):
                try:
                    tracker.log(metrics, step)
                except Exception as e:
                    self._drop(name, "log", e)
                    del live[name]
        for name, tracker in live.items():
            try:
                tracker.close()
            except Exception as e:
                self._drop(name, "close", e)


def start_trackers(settings: RunConfig, recorded: dict[str, Any], run_dir: Path) -> TrackerFeed:
    """The run's trackers, run.trackers (none by default: then nothing starts and `log` returns at
    once); `recorded` is the run's whole config as plain data, which each tracker stores with the run."""
    names = settings.trackers
    check_installed(names)
    return TrackerFeed({name: (lambda opener=OPENERS[name]: opener(Path(run_dir), settings, recorded))
                        for name in names})
