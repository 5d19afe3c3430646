"""The simulator's claim, checked on this machine: a cost profile measured just before predicts what
`bench e2e` then measures for sync, one-step and async. Timing on a shared machine is noisy, so
the bounds are loose (the README reports the tighter figures of the full-size check,
`.ci/simulate-check`); the test exists to catch a model that is wrong, not one that is 20% off.

At this small size (a second or two per mode) the machine's speed drifts between the profile and
the e2e run: on the 2 shared cores the absolute samples/s errors of repeated runs spread from -28%
to +89%, sync included, while the predicted speedups over sync (what the simulator is for) stayed
within 46% of the measured ones in most runs, but 59% and 79% in two (async, where the measured
trainer sat idle a third of the time: the generator ran slower than its profile in that run; the
contention between the two sides is measured in a few seconds). So speedups are held only to a
factor of 2 (error < 100%), and absolute samples/s to a factor of 2.5: enough to catch a wrong
unit, a missing cost or overlap that is not modelled, not a model that is 20% off."""
import json

import pytest

from aioareal.cli import main

SETUP = ["--model", "tiny", "--threads", "1", "--batch-groups", "4", "--group-size", "4", "--prompt-len", "16",
         "--max-new-tokens", "80", "--mean-len", "24"]
BOUND = 1.0  # |predicted speedup / measured speedup - 1|, speedup = samples/s over sync's
FACTOR = 2.5  # predicted and measured samples/s within this factor of each other


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
        assert 1 / FACTOR < r["predicted_samples_s"] / r["measured_samples_s"] < FACTOR, out
    sync = rows[0]
    for r in rows[1:]:
        predicted = r["predicted_samples_s"] / sync["predicted_samples_s"]
        measured = r["measured_samples_s"] / sync["measured_samples_s"]
        assert abs(predicted / measured - 1) < BOUND, (r["mode"], predicted, measured, out)
    # Sync never overlaps: its idle fractions follow from the two step costs alone.
    assert abs(sync["predicted_gen_idle"] - sync["measured_gen_idle"]) < 0.2, out
