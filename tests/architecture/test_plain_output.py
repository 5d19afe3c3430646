"""With output piped (CI, logs), a run prints one plain line per step and no dashboard."""
import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_piped_run_prints_one_plain_line_per_step(tmp_path, tiny_model_path):
    result = subprocess.run([sys.executable, "-m", "aioareal", "--steps", "3", "--run-dir", str(tmp_path / "run"),
                             "algo.batch_groups=4", "eval.every=2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [int(re.match(r"step +(\d+)", line).group(1)) for line in lines] == [0, 1, 2, 3]
    assert re.fullmatch(r"step 0/3 \| t +[\d.]+s \| eval [\d.]+", lines[0])
    assert "reward" in lines[1] and "eval" not in lines[1] and "eval" in lines[2]
    assert "\x1b[" not in result.stdout  # no terminal control codes in a pipe
    assert lines[3].startswith("step 3/3")
