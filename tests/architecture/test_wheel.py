"""What the wheel ships: the trainer and its user-facing commands, no test data, grading cases or test
doubles (docs/architecture.md#layout). The wheel is built for real, from a copy of the repository
(setuptools' own build, as pip runs it, without the network)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Not part of the source: git, run outputs, build leftovers and caches, and the virtual environments
# CI and developers keep inside the checkout (.ci/run makes .venv there: 1.7 GB to copy, 20 s).
LEFT_BEHIND = (".git", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis",
               ".venv", "venv", ".ruff_cache", ".whl", ".carry")


def built_wheel(tmp_path: Path) -> dict[str, bytes]:
    """The files inside the wheel built from a copy of the working tree, by name."""
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
    build = "from setuptools import build_meta; print(build_meta.build_wheel('wheel'))"
    done = subprocess.run([sys.executable, "-c", build], cwd=source, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with zipfile.ZipFile(source / "wheel" / done.stdout.strip().splitlines()[-1]) as wheel:
        return {name: wheel.read(name) for name in wheel.namelist()}


def test_the_wheel_ships_no_test_data_cases_or_doubles(tmp_path: Path) -> None:
    names = built_wheel(tmp_path)
    shipped = {"aioareal/__main__.py", "aioareal/cli.py", "aioareal/lab/bench/reward.py", "aioareal/lab/bench/cases.py"}
    assert shipped <= set(names)  # the trainer and its commands
    assert [n for n in names if not n.startswith(("aioareal/", "aioareal-"))] == []  # no tests/, no data/
    assert [n for n in names if not n.endswith(".py") and not n.startswith("aioareal-")] == []
    assert [n for n in names if any(word in n for word in ("cases.jsonl", "grading_cases", "real_completions",
                                                           "simulated_workers"))] == []
    # the test doubles (SimulatedGenerator, SimulatedTrainer) live in tests/simulated_workers.py
    assert [n for n, text in names.items() if b"class Simulated" in text] == []
