"""`report` and `plot` on a run's metrics.jsonl of odd values (issue 49): a step or a time that is
not a finite number, a row without `time`, measures of the wrong type. Each is read as no step, no
time or no value: the commands finish (or say in one line that nothing is left to read), never a
traceback or a numpy warning."""
from __future__ import annotations

import pytest

from aioareal.cli import main

ODD = {
    "no time, odd measures": '{"step": 1, "reward_mean": Infinity, "loss": "abc"}\n'
                             '{"step": 2, "reward_mean": [1, 2], "loss": {"a": 1}}\n',
    "an infinite step": '{"step": Infinity, "time": 1}\n{"step": 2, "time": 2, "eval_pass_rate": 0.5}\n',
    "an infinite time": '{"step": 1, "time": Infinity, "eval_pass_rate": 0.5}\n'
                        '{"step": 2, "time": -Infinity, "eval_pass_rate": 0.75}\n',
}


@pytest.mark.parametrize("case", sorted(ODD))
@pytest.mark.parametrize("command", ["report", "plot"])
def test_odd_metrics_are_read_without_a_traceback(case, command, tmp_path, capsys, recwarn):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model:\n  name: tiny\nalgo:\n  batch_groups: 2\n  group_size: 4\n")
    (run / "metrics.jsonl").write_text(ODD[case])
    args = [command, str(run)] + (["--out", str(tmp_path / "figures")] if command == "plot" else [])
    assert main(args) == 0
    assert capsys.readouterr().err == ""
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
