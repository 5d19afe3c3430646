"""The tiny model's warm-start (run/warmup.py) says how far it is while it trains, never silent
for long, and ends with its summary line."""
from __future__ import annotations

from aioareal.config import load_config
from aioareal.run import warmup


def test_the_warm_start_reports_progress_then_its_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(warmup, "PROGRESS_EVERY_S", 0.0)  # every evaluation, instead of every 10 s
    config = load_config(None, ["warmup.max_steps=25", "warmup.target_pass_rate=0.99", "warmup.batch_size=4",
                                "data.eval_size=8"])
    said: list[str] = []
    summary = warmup.train_tiny(config, tmp_path / "tiny", log=said.append)
    assert said[0].startswith("warm-start: step 25 of at most 25, held-out pass rate ")
    assert said[0].endswith(" s") and "(stops at 0.99)" in said[0]
    assert said[-1].startswith(f"warm-start: {summary['steps']} steps, held-out pass rate")
