"""The live terminal dashboard, and the plain one-line-per-step format used when there is no TTY
(`plain_line`, at the end).

Design: the dashboard only reads a `Snapshot` (monitor/metrics.py), which the event loop builds and
swaps in whole. rich's `Live` refreshes from its own thread, calling `snapshot_fn` there to fetch
the latest one; everything it draws is formatting of numbers the run already holds. `render` is a
pure function of the snapshot (and the terminal width, read at render time): sparklines, bars and
the busy timelines grow with the width; at >= 90 columns the panels sit in a two-column grid that
stays within 30 rows at 100 columns, narrower terminals stack them. A failing snapshot or render
shows a one-line error panel instead of raising into the run.

What reaches the terminal without the dashboard: one plain line per step (logs, pipes, TERM=dumb),
the choice between the two, and the number format both use.
"""
from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..errors import one_line
from .metrics import Snapshot

TICKS = "▁▂▃▄▅▆▇█"
EIGHTHS = "▏▎▍▌▋▊▉█"
TWO_COLUMNS_MIN = 90  # narrower terminals stack the panels in one column
HIST_ROWS = 6  # staleness rows shown; higher staleness values share the last row


def sparkline(values: list[float], width: int, lo: float | None = None, hi: float | None = None) -> str:
    """`width` characters from ▁ to █ (bucket means when downsampling, repeats when stretching);
    scaled to [lo, hi], by default the values' own range. Non-finite values are skipped; no values
    give ""; a constant series sits mid-height."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite or width <= 0:
        return ""
    points = _resample(finite, width)
    lo = min(points) if lo is None else lo
    hi = max(points) if hi is None else hi
    if hi - lo < 1e-12:
        return TICKS[3] * width
    top = len(TICKS) - 1
    return "".join(TICKS[min(top, max(0, round((v - lo) / (hi - lo) * top)))] for v in points)


def _resample(values: list[float], width: int) -> list[float]:
    n = len(values)
    if n <= width:
        return [values[i * n // width] for i in range(width)]
    return [sum(chunk) / len(chunk) for chunk in (values[i * n // width:(i + 1) * n // width] for i in range(width))]


def timeline(values: list[float], width: int) -> str:
    """One character per recent step (the last `width`), busy fraction 0 -> ▁, 1 -> █."""
    recent = values[-width:] if width > 0 else []
    return sparkline(recent, len(recent), lo=0.0, hi=1.0)


def bar(fraction: float, width: int, empty: str = "░") -> str:
    """A horizontal bar in eighths of a cell; any positive fraction shows at least ▏."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    if fraction > 0 and eighths == 0:
        eighths = 1
    full, part = divmod(eighths, 8)
    text = "█" * full + (EIGHTHS[part - 1] if part else "")
    return text + empty * (width - len(text))


def hms(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _line(*parts: str | tuple[str, str]) -> Text:
    return Text.assemble(*parts, no_wrap=True, overflow="ellipsis")


# --- panels: each body is a list of one-line Texts, so a panel's height is known in advance ---

def _system(s: Snapshot) -> list[Text]:
    lines = [_line(("version  ", "dim"), f"trainer {s.trainer_version}  ·  generator {s.generator_version}"),
             _line(("groups   ", "dim"), f"running {s.groups_running}  ·  ready {s.groups_ready}")]
    if s.episode:  # a multi-turn run: turns, observations, tools (calls, errors, mean latency)
        e = s.episode
        lines.append(_line(("episodes ", "dim"), f"{e.get('turns_mean', 0):.2f} turns  ·  "
                           f"{e.get('obs_tokens_mean', 0):.1f} obs tok  ·  {e.get('episode_errors', 0):.0f} err"))
        lines.append(_line(("tools    ", "dim"), f"{e.get('tool_calls', 0):.0f} calls  ·  "
                           f"{e.get('tool_errors', 0):.0f} errors  ·  {e.get('tool_latency_mean', 0) * 1000:.0f} ms"))
    if not s.gpu_memory:
        return lines + [_line(("memory   ", "dim"), "CPU (no GPU memory to show)")]
    for name, used, total in s.gpu_memory:
        lines.append(_line(("memory   ", "dim"), f"{name} ", (bar(used / total if total else 0, 10), "magenta"),
                           f" {used:.1f} / {total:.1f} GiB"))
    return lines


def _learning(s: Snapshot, width: int) -> list[Text]:
    spark = max(4, width - 20)
    last_eval = f"{fmt(s.evals[-1][1], '.3f')} @ {s.evals[-1][0]}" if s.evals else "-"
    reward = fmt(s.rewards[-1], ".3f") if s.rewards else "-"
    return [
        _line(("reward  ", "dim"), (f"{sparkline(s.rewards, spark):<{spark}}", "cyan"), f" {reward:>11}"),
        # A pass rate on its own scale, 0 to 1: min-max scaling drew 0.34 -> 0.43 as floor to ceiling.
        _line(("eval    ", "dim"), (f"{sparkline([r for _, r in s.evals], spark, lo=0.0, hi=1.0):<{spark}}", "green"),
              f" {last_eval:>11}"),
        _line(("loss ", "dim"), f"{fmt(s.loss, '+.4f'):<10}", ("kl ", "dim"), fmt(s.kl, ".4f")),
        _line(("grad norm ", "dim"), f"{fmt(s.grad_norm, '.3f'):<10}", ("clip ", "dim"), fmt(s.clip_frac, ".3f")),
        # How far off-policy the trained tokens are, and what the decoupled cap removes.
        _line(("w behav ", "dim"), f"{fmt(s.behav_weight_mean, '.3f')} max {fmt(s.behav_weight_max, '.2f'):<7}",
              ("capped ", "dim"), fmt(s.capped_frac, ".3f")),
        # Engine vs trainer on the trainer's own version's tokens: should stay near 0; growth collapses runs.
        _line(("logp gap ", "dim"), f"{fmt(s.logprob_gap_mean, '.4f')} max {fmt(s.logprob_gap_max, '.3f')}"),
    ]


def _throughput(s: Snapshot, width: int) -> list[Text]:
    busy_w = max(6, width - 32)
    gen = s.gen_busy[-1] if s.gen_busy else 0.0
    train = s.train_busy[-1] if s.train_busy else 0.0
    return [
        _line(("gen   ", "dim"), f"{s.gen_tokens_per_s:>8,.0f} tok/s  ", (bar(gen, busy_w), "green"),
              f" {gen:>4.0%} busy"),
        _line(("train ", "dim"), f"{s.train_tokens_per_s:>8,.0f} tok/s  ", (bar(train, busy_w), "yellow"),
              f" {train:>4.0%} busy"),
        _line(("samples ", "dim"), f"{s.samples_per_s:.1f}/s"),
        *([_line(("ranks busy  gen ", "dim"), " ".join(f"{b:.0%}" for b in s.gen_busy_ranks),
                 ("  ·  train ", "dim"), " ".join(f"{b:.0%}" for b in s.train_busy_ranks))]
          if s.gen_busy_ranks else []),
        _line(("step s ", "dim"), _phases(s.train_phases, width - 7)),  # seconds per phase, last step
        _line(("gen s  ", "dim"), _phases(s.gen_phases, width - 7)),
        _line(("busy per step, oldest to newest", "dim")),
        _line(("gen   ", "dim"), (timeline(s.gen_busy, width - 6), "green")),
        _line(("train ", "dim"), (timeline(s.train_busy, width - 6), "yellow")),
    ]


def _phases(seconds: dict[str, float], width: int) -> str:
    """The phases that took longest, `name 0.41s` each, as many as fit in `width`."""
    text = ""
    for name, value in sorted(seconds.items(), key=lambda kv: -kv[1]):
        item = f"{name} {value:.2f}s"
        if len(text) + len(item) + 2 > width:
            break
        text = f"{text}  {item}" if text else item
    return text or "-"


def _hist_rows(hist: dict[int, int]) -> list[tuple[str, int]]:
    top = max(hist)
    if top < HIST_ROWS:
        return [(str(k), hist.get(k, 0)) for k in range(top + 1)]
    head = [(str(k), hist.get(k, 0)) for k in range(HIST_ROWS - 1)]
    return head + [(f"≥{HIST_ROWS - 1}", sum(n for k, n in hist.items() if k >= HIST_ROWS - 1))]


def _staleness(s: Snapshot, width: int) -> list[Text]:
    lines = [_line((f"samples by staleness (K = {s.max_staleness}), recent batches", "dim"))]
    if s.staleness_hist:
        rows = _hist_rows(s.staleness_hist)
        most = max(n for _, n in rows) or 1
        lines += [_line(f"{label:>3} ", (bar(n / most, width - 11, " "), "blue"), f" {n:>6}") for label, n in rows]
    else:
        lines.append(_line(("  no trained batches yet", "dim")))
    return lines + [_line(("groups   ", "dim"), f"dropped (stale) {s.dropped_stale}  ·  rejected {s.rejected}"),
                    _line(("rewards  ", "dim"), f"failures {s.reward_failures}")]


COMPLETION_LINES = 2


def _completion(s: Snapshot, width: int) -> tuple[str, list[Text]]:
    """The latest trained completion, its whitespace folded and control characters escaped (a model can
    write terminal escapes), cut to COMPLETION_LINES lines of `width`."""
    if s.completion_reward is None:
        return "latest completion", [_line(("  no trained batches yet", "dim"))]
    title = f"latest completion · step {s.completion_step} · reward {fmt(s.completion_reward, '.3f')}"
    if s.completion is None:
        return title, [_line(("  no text (run.sample_text_chars=0)", "dim"))]
    flat = " ".join(one_line(word) for word in s.completion.split())
    cuts = [flat[i * width:(i + 1) * width] for i in range(COMPLETION_LINES - 1)]
    lines = [_line(cut) for cut in cuts] + [_line(flat[(COMPLETION_LINES - 1) * width:])]
    if s.completion_prompt:  # what it answers, on a line of its own above it
        asked = " ".join(one_line(word) for word in str(s.completion_prompt).split())
        lines.insert(0, _line(("prompt ", "dim"), (asked[:max(1, width - 7)], "dim")))
    return title, lines


def _header(s: Snapshot) -> Panel:
    total = max(s.steps_total, 1)
    info = _line(("mode ", "dim"), (one_line(s.mode), "bold"), ("  ·  K ", "dim"), str(s.max_staleness),
                 ("  ·  objective ", "dim"), one_line(s.objective), ("  ·  device ", "dim"), one_line(s.devices))
    progress = Table.grid(expand=True, padding=(0, 1))
    progress.add_column(no_wrap=True)
    progress.add_column(ratio=1)
    progress.add_column(no_wrap=True)
    progress.add_row(f"step {s.step}/{s.steps_total}", ProgressBar(total=total, completed=min(s.step, total)),
                     f"{s.step / total:>4.0%}  ·  elapsed {hms(s.elapsed)}  ·  ETA {hms(s.eta)}")
    # A str title is rich markup: the run's name is data (a directory name), escaped and made one line.
    title = f"aioareal · {escape(one_line(s.run_name))}" if s.run_name else "aioareal"
    return Panel(Group(info, progress), title=title, title_align="left")


def _panel(title: str, lines: list[Text], height: int | None = None) -> Panel:
    return Panel(Group(*lines), title=title, title_align="left", height=height)


class _Screen:
    """Lays the panels out for the width rich renders at."""

    def __init__(self, snap: Snapshot, header: RenderableType | None) -> None:
        self.snap, self.header = snap, header

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        s, width = self.snap, options.max_width
        two = width >= TWO_COLUMNS_MIN
        inner = (width // 2 if two else width) - 4  # panel border and padding
        rows = [(("policy · queues · memory", _system(s)), ("learning", _learning(s, inner))),
                (("throughput · busy", _throughput(s, inner)), ("staleness", _staleness(s, inner)))]
        if self.header is not None:
            yield self.header
        yield _header(s)
        for (lt, left), (rt, right) in rows:
            if not two:
                yield _panel(lt, left)
                yield _panel(rt, right)
                continue
            height = max(len(left), len(right)) + 2
            grid = Table.grid(expand=True)
            grid.add_column(ratio=1)
            grid.add_column(ratio=1)
            grid.add_row(_panel(lt, left, height), _panel(rt, right, height))
            yield grid
        yield _panel(*_completion(s, width - 4))


def render(snap: Snapshot, header: RenderableType | None = None) -> RenderableType:
    """One screen of the run; `header` (the sweep's progress line, say) goes above it."""
    return _Screen(snap, _plain(header))


class _Guarded:
    """Renders `build()` fully inside a try, so no error reaches Live's thread or the run."""

    def __init__(self, build: Callable[[], RenderableType]) -> None:
        self.build = build

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        try:
            segments = list(console.render(self.build(), options))
        except Exception as exc:  # noqa: BLE001 -- the dashboard must never stop the run
            yield Panel(_line(("dashboard error: ", "bold red"), one_line(f"{type(exc).__name__}: {exc}")),
                        border_style="red")
            return
        yield from segments


def _plain(header: RenderableType | None) -> RenderableType | None:
    """A str header (the sweep's line, naming runs) as one plain line: rich would read it as markup."""
    return Text(one_line(header), no_wrap=True, overflow="ellipsis") if isinstance(header, str) else header


class Dashboard:
    """`with Dashboard(state.snapshot): run()` shows the live screen while the run prints above it."""

    def __init__(self, snapshot_fn: Callable[[], Snapshot], console: Console | None = None,
                 header_fn: Callable[[], RenderableType | None] | None = None,
                 refresh_per_second: float = 4) -> None:
        self.snapshot_fn, self.header_fn = snapshot_fn, header_fn
        self.live = Live(get_renderable=self._renderable, console=console, refresh_per_second=refresh_per_second,
                         auto_refresh=True, transient=False, redirect_stdout=True, redirect_stderr=True,
                         screen=False)

    def _renderable(self) -> RenderableType:
        return _Guarded(lambda: render(self.snapshot_fn(), self.header_fn() if self.header_fn else None))

    def __enter__(self) -> Dashboard:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.__exit__(*exc)


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def wants_dashboard(setting: str, stream: TextIO | None = None) -> bool:
    """'on', 'off', or 'auto': on only for an interactive terminal (not a pipe, file or TERM=dumb)."""
    if setting not in ("on", "off", "auto"):
        raise ValueError(f"dashboard setting '{setting}': expected 'on', 'off' or 'auto'")
    if setting != "auto":
        return setting == "on"
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM", "") != "dumb"


def _num(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def plain_line(row: dict[str, Any], steps: int | None = None) -> str:
    """One line per step for logs and pipes; missing, None or NaN fields are left out."""
    step = f"step {row.get('step', 0):>{len(str(steps)) if steps else 4}}" + (f"/{steps}" if steps else "")
    parts = [step, f"t {fmt(_num(row, 'time'), '7.1f')}s"]
    for key, label, spec in (("reward_mean", "reward", ".3f"), ("loss", "loss", "+.4f"), ("kl", "kl", ".4f")):
        if _num(row, key) is not None:
            parts.append(f"{label} {row[key]:{spec}}")
    if _num(row, "staleness_mean") is not None:
        parts.append(f"stale {row['staleness_mean']:.2f}/{fmt(_num(row, 'staleness_max'), '.0f')}")
    for key, label in (("gen_tokens_per_s", "gen"), ("train_tokens_per_s", "train")):
        if _num(row, key) is not None:
            parts.append(f"{label} {row[key]:,.0f} tok/s")
    gen_idle, train_idle = _num(row, "gen_idle_frac"), _num(row, "train_idle_frac")
    if gen_idle is not None or train_idle is not None:
        parts.append(f"idle gen {fmt(gen_idle, '.0%')} train {fmt(train_idle, '.0%')}")
    if _num(row, "turns_mean") is not None:  # episodes
        calls, errors = row.get("tool_calls", 0), row.get("tool_errors", 0)
        parts.append(f"turns {row['turns_mean']:.2f} tools {calls} ({errors} err)")
    if row.get("dropped_stale"):
        parts.append(f"dropped {row['dropped_stale']}")
    if _num(row, "eval_pass_rate") is not None:
        parts.append(f"eval {row['eval_pass_rate']:.3f}")
    return " | ".join(parts)
