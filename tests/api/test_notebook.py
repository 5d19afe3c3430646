"""The example notebook (docs/notebooks/quickstart.ipynb) runs headlessly, offline, end to end: a
Dataset, a lambda reward, a stop and a resume, the metrics, an evaluation. Committed with outputs
cleared, so the repository never holds a stale result."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebooks" / "quickstart.ipynb"


def test_the_notebook_is_committed_without_outputs():
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in cells if c["cell_type"] == "code")


@pytest.mark.slow
def test_the_notebook_runs(tmp_path, monkeypatch, tiny_model_path):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    # The kernel inherits this environment: the suite's warm-start cache, and a run directory in tmp_path.
    monkeypatch.setenv("AIOAREAL_WARMUP_DIR", str(tiny_model_path.parent.resolve()))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = {i: "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in c.outputs)
               for i, c in enumerate(notebook.cells) if c.cell_type == "code"}
    assert "(True, 30)" in outputs[5] and "(False, 60)" in outputs[7]  # stopped at 30, resumed to 60
    assert "eval_pass_rate" in outputs[8] and "'tiny'" in outputs[10]
    runs = [d for d in (tmp_path / "runs").iterdir() if d.name != "_warmup"]
    assert len(runs) == 2 and {p.name for p in runs} >= {next(p.name for p in runs if p.name.startswith("eval-"))}
