"""The dashboard drawn from hand-built snapshots on recording consoles, and the plain line format."""
from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console
from rich.text import Text

from aioareal.monitor.dashboard import TICKS, Dashboard, plain_line, render, sparkline, wants_dashboard
from aioareal.monitor.metrics import Snapshot


def make_snapshot(**overrides) -> Snapshot:
    values = dict(
        run_name="async-decoupled-20250612-141503", mode="async", max_staleness=2, objective="decoupled",
        devices="cuda:0 / cuda:1", elapsed=83.4, eta=192.0, step=120, steps_total=400, trainer_version=120,
        generator_version=119, groups_running=11, groups_ready=3, gen_tokens_per_s=18143.2,
        train_tokens_per_s=9021.7, samples_per_s=45.63,
        gen_busy=[0.9, 0.95, 1.0, 0.97] * 30, train_busy=[0.2, 0.6, 0.4, 0.16] * 30,
        staleness_hist={0: 210, 1: 402, 2: 28}, dropped_stale=5, rejected=3, reward_failures=1,
        rewards=[0.1 + i / 200 for i in range(120)], evals=[(0, 0.355), (50, 0.47), (100, 0.575)],
        loss=-0.0082, kl=0.0013, grad_norm=0.412, clip_frac=0.031,
        behav_weight_mean=1.043, behav_weight_max=7.25, capped_frac=0.012,
        gpu_memory=[("cuda:0", 12.31, 79.65), ("cuda:1", 30.05, 79.65)])
    return Snapshot(**{**values, **overrides})


def draw(snap: Snapshot, width: int = 100, height: int = 30, header=None) -> str:
    console = Console(record=True, width=width, height=height, force_terminal=True, color_system=None,
                      file=io.StringIO())
    console.print(render(snap, header))
    return console.export_text()


def reward_spark(text: str) -> str:
    line = next(line for line in text.splitlines() if "reward " in line and any(t in line for t in TICKS))
    return "".join(ch for ch in line.split("reward", 1)[1] if ch in TICKS)


def hist_rows(text: str) -> dict[str, str]:
    """Staleness histogram rows, label -> count: `│   1 █████▌     402 │` at the end of a line."""
    return dict(re.findall(r"│ +(≥?\d+) [█▉▊▋▌▍▎▏]+ +(\d+) │$", text, re.M))


@pytest.mark.parametrize("width", [100, 160])
def test_every_panel_shows_its_content(width):
    text = draw(make_snapshot(), width=width, height=30 if width == 100 else 40)
    for expected in [
        "async-decoupled-20250612-141503", "mode async", "K 2", "objective decoupled", "cuda:0 / cuda:1",
        "step 120/400", "30%", "elapsed 0:01:23", "ETA 0:03:12",  # header
        "trainer 120", "generator 119", "running 11", "ready 3",  # versions and queues
        "18,143 tok/s", "9,022 tok/s", "45.6/s", "97% busy", "16% busy",  # throughput and current busy
        "dropped (stale) 5", "rejected 3", "failures 1",  # ledger
        "0.695", "0.575 @ 100",  # latest reward and eval
        "loss -0.0082", "kl 0.0013", "grad norm 0.412", "clip 0.031",
        "w behav 1.043 max 7.25", "capped 0.012",
        "cuda:0 ", "12.3 / 79.7 GiB", "30.1 / 79.7 GiB",
    ]:
        assert expected in text, f"{expected!r} missing from\n{text}"
    assert hist_rows(text) == {"0": "210", "1": "402", "2": "28"}
    assert "CPU" not in text


def test_busy_timelines_show_one_character_per_step():
    text = draw(make_snapshot(gen_busy=[1.0] * 120, train_busy=[0.0, 1.0] * 60))
    lines = text.splitlines()
    gen = next(line for line in lines if "│ gen   " in line and "tok/s" not in line)
    train = next(line for line in lines if "│ train " in line and "tok/s" not in line)
    assert "█" * 30 in gen and "▁█" * 15 in train
    assert "█" * 10 in next(line for line in lines if "100% busy" in line)  # the current-value bar


def test_cpu_run_says_cpu_and_empty_snapshot_renders():
    assert "CPU" in draw(make_snapshot(gpu_memory=[], devices="cpu"))
    text = draw(Snapshot())
    assert "no trained batches yet" in text and "ETA -" in text and "loss -" in text


def test_high_staleness_shares_the_last_histogram_row():
    text = draw(make_snapshot(max_staleness=8, staleness_hist={0: 4, 3: 2, 6: 7, 8: 1}))
    assert hist_rows(text) == {"0": "4", "3": "2", "≥5": "8"}  # empty rows have no bar; 7 + 1 at >= 5


def test_fits_100x30_with_sweep_header_and_uses_wider_terminals():
    narrow = draw(make_snapshot(), 100, 30, header=Text("sweep 2/6 · K=2 seed 1"))
    lines = narrow.splitlines()
    assert lines[0] == "sweep 2/6 · K=2 seed 1"
    assert len(lines) <= 30 and max(len(line) for line in lines) <= 100
    wide = draw(make_snapshot(), 160, 40)
    assert max(len(line) for line in wide.splitlines()) > 100
    assert len(reward_spark(wide)) > len(reward_spark(narrow)) > 10


def test_sparkline_edge_cases():
    assert sparkline([], 10) == ""
    assert sparkline([1.0, 2.0], 0) == ""
    assert sparkline([3.0] * 5, 4) == "▄▄▄▄"  # constant: mid-height
    assert sparkline([0.0, 1.0], 2) == "▁█"
    assert sparkline([0.0, 1.0], 4) == "▁▁██"  # stretched
    assert sparkline([0, 0, 1, 1, 0, 0], 3) == "▁█▁"  # bucket means
    assert sparkline(list(range(100)), 20)[0] == "▁" and len(sparkline(list(range(100)), 20)) == 20
    assert sparkline([float("nan"), 0.0, 1.0], 2) == "▁█"
    assert sparkline([0.5], 3, lo=0.0, hi=1.0) == "▅▅▅"


class FakeStream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_wants_dashboard(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    assert wants_dashboard("auto", FakeStream(True))
    assert not wants_dashboard("auto", FakeStream(False))
    assert not wants_dashboard("auto", io.StringIO())
    assert wants_dashboard("on", FakeStream(False)) and not wants_dashboard("off", FakeStream(True))
    monkeypatch.setenv("TERM", "dumb")
    assert not wants_dashboard("auto", FakeStream(True))
    with pytest.raises(ValueError, match="'maybe'"):
        wants_dashboard("maybe")


FULL_ROW = {
    "step": 25, "version": 25, "time": 6.83, "reward_mean": 0.1875, "loss": 0.0031, "kl": 0.0, "grad_norm": 0.3,
    "staleness_mean": 0.42, "staleness_max": 2, "dropped_stale": 0, "gen_tokens_per_s": 9366.4,
    "train_tokens_per_s": 4120.0, "samples_per_s": 12.0, "gen_idle_frac": 0.05, "train_idle_frac": 0.61,
    "clip_frac": None, "eval_pass_rate": 0.355,
}


def test_plain_line_full_row():
    assert plain_line(FULL_ROW, steps=400) == (
        "step  25/400 | t     6.8s | reward 0.188 | loss +0.0031 | kl 0.0000 | stale 0.42/2 | "
        "gen 9,366 tok/s | train 4,120 tok/s | idle gen 5% train 61% | eval 0.355")
    assert plain_line({**FULL_ROW, "dropped_stale": 2, "eval_pass_rate": None}).startswith("step   25 | t ")
    assert "dropped 2" in plain_line({**FULL_ROW, "dropped_stale": 2})


def test_plain_line_step_zero_row():
    row = {"step": 0, "version": 0, "time": 0.12, "eval_pass_rate": 0.355, "eval_len_mean": 4.0}
    assert plain_line(row) == "step    0 | t     0.1s | eval 0.355"
    assert plain_line({**row, "eval_pass_rate": float("nan")}) == "step    0 | t     0.1s"


def recording_console() -> Console:
    return Console(record=True, width=100, height=30, force_terminal=True, color_system=None, file=io.StringIO())


def test_dashboard_survives_a_failing_snapshot():
    def broken() -> Snapshot:
        raise RuntimeError("snapshot exploded")

    console = recording_console()
    with Dashboard(broken, console=console, refresh_per_second=50):
        time.sleep(0.3)
    assert "dashboard error: RuntimeError: snapshot exploded" in console.export_text()


def test_dashboard_refreshes_with_header():
    console = recording_console()
    with Dashboard(make_snapshot, console=console, header_fn=lambda: Text("sweep 1/3"), refresh_per_second=50):
        time.sleep(0.1)
    text = console.export_text()
    assert "sweep 1/3" in text and "async-decoupled-20250612-141503" in text


def test_the_eval_sparkline_is_drawn_on_the_pass_rates_own_scale():
    import io

    import torch
    from rich.console import Console

    from aioareal.monitor.dashboard import TICKS, render
    from aioareal.monitor.metrics import LiveState

    live = LiveState("run", "sync", 0, "ppo", [torch.device("cpu")], 10)
    for step, rate in enumerate([0.34, 0.38, 0.43]):
        live.record({"step": step, "reward_mean": 0.5, "eval_pass_rate": rate})
    console = Console(record=True, width=100, height=30, force_terminal=True, color_system=None, file=io.StringIO())
    console.print(render(live.refresh()))
    line = next(t for t in console.export_text().splitlines() if "eval " in t and "@" in t)
    drawn = [c for c in line if c in TICKS]
    # 0.34 -> 0.43 is a small rise: low blocks, not floor to ceiling as a min-max scale would draw it.
    assert drawn and max(TICKS.index(c) for c in drawn) <= 3 and TICKS[0] not in drawn, line


def test_lines_on_stderr_print_above_the_live_frame_not_into_it(capsys):
    """A warning written to stderr while the dashboard is live goes through its console, above the
    frame (rich redraws the frame below it), not straight to the terminal through the frame's lines."""
    import sys

    console = recording_console()
    with Dashboard(make_snapshot, console=console, refresh_per_second=50):
        print("warning: something the run says on stderr", file=sys.stderr)
        time.sleep(0.05)
    assert "warning: something the run says on stderr" in console.export_text()
    assert "something the run says" not in capsys.readouterr().err
