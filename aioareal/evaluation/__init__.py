"""Held-out evaluation: completions of an evaluation set scored on one path, and the in-run evaluator
built on it (scored_completions.py); pass@k, maj@k and their standard errors (pass_at_k.py);
lm-evaluation-harness's GSM8K scoring (lm_eval.py)."""
