"""The simulator's claim, checked on this machine: a cost profile measured just before predicts what
`bench e2e` then measures for sync, one-step and async. Timing on a shared machine is noisy, so
the bound is loose (the README reports the tighter figures of the full-size check,
`.ci/simulate-check`); the test exists to catch a model that is wrong, not one that is 20% off."""
import json

import pytest

from aioareal.cli import main

SETUP = ["--model", "tiny", "--threads", "1", "--batch-groups", "4", "--group-size", "4", "--prompt-len", "16",
         "--max-new-tokens", "80", "--mean-len", "24"]
BOUND = 0.5  # |predicted / measured - 1| for samples/s


@pytest.mark.slow
def test_profile_predicts_bench_e2e_on_this_machine(tmp_path, capsys):
    profile, bench = tmp_path / "profile.json", tmp_path / "e2e.jsonl"
    assert main(["bench", "profile", *SETUP, "--repeats", "4", "--write", str(profile)]) == 0
    assert main(["bench", "e2e", *SETUP, "--steps", "3", "--warmup-steps", "1", "--out", str(bench)]) == 0
    capsys.readouterr()
    assert main(["simulate", "--profile", str(profile), "--against", str(bench)]) == 0
    out = capsys.readouterr().out
    rows = json.loads(out.strip().splitlines()[-1])["rows"]
    assert [r["mode"] for r in rows] == ["sync", "one-step", "async"]
    for r in rows:
        assert abs(r["error"]) < BOUND, out
    # Sync never overlaps: its idle fractions follow from the two step costs alone.
    sync = rows[0]
    assert abs(sync["predicted_gen_idle"] - sync["measured_gen_idle"]) < 0.2, out
