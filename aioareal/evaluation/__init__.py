"""Held-out evaluation: completions of an evaluation set scored on one path, and the in-run evaluator
built on it, with pass@k, maj@k and their standard errors (scored_completions.py);
lm-evaluation-harness's GSM8K scoring (lm_eval.py)."""
