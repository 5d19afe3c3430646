"""Evaluation sets on the engine (rollout.py), final answers for voting (pass_at_k.py) and the figures
(metrics.py): what `eval` and the in-run evaluation share."""
