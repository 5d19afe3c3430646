"""Every configuration keeps a curve of its own in the report's figures past the default cycle's ten
colours (experiments/plots.py draw_figures): issue 38's sweep draws 16; each PNG is written whole by rename,
so a link planted at its name is replaced, never followed."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from aioareal.lab.experiments.load import Run
from aioareal.lab.experiments.plots import FILES, draw_figures


def test_sixteen_configurations_draw_sixteen_distinct_curves():
    metrics = pd.DataFrame({"step": [0, 5], "time": [0.0, 1.0], "eval_pass_rate": [0.1, 0.4]})
    groups = {f"config {i}": [Run(f"r{i}", Path("."), {}, metrics, pd.DataFrame(), True)] for i in range(16)}
    figures = draw_figures(groups, 0.4, "given")  # what plot_runs saves, in FILES order
    assert FILES[0] == "pass_rate_vs_step.png"
    lines = figures[0].axes[0].get_lines()
    styles = {(line.get_linestyle(), tuple(line.get_color())) for line in lines}
    assert len(lines) == 16 and len(styles) == 16
    assert {line.get_linestyle() for line in lines[:10]} == {"-"}  # up to ten: the usual solid colours


def test_a_link_planted_at_a_figures_name_is_replaced_not_followed(tmp_path):
    from aioareal.lab.experiments.plots import plot_runs

    metrics = pd.DataFrame({"step": [0, 5], "time": [0.0, 1.0], "eval_pass_rate": [0.1, 0.4]})
    out, victim = tmp_path / "plots", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious")
    (out / FILES[0]).symlink_to(victim)
    paths = plot_runs([Run("r", Path("."), {}, metrics, pd.DataFrame(), True)], out, 0.4)
    assert victim.read_text() == "precious"
    assert not (out / FILES[0]).is_symlink() and (out / FILES[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths and not list(out.glob(".*.tmp"))  # no temporary file left
