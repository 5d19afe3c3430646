"""Every configuration keeps a curve of its own in the report's figures past the default cycle's ten
colours (experiments/plots.py draw_figures): issue 38's sweep draws 16."""
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
