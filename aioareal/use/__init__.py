"""Use what you trained: `eval` scores runs, checkpoints and models side by side (eval_command.py),
`chat` talks to one (chat.py); both take a TARGET that `targets.py` resolves to a policy. `export`
writes a trained policy as GGUF or to the Hub (export.py); `samples` prints what a run's model wrote
(samples.py)."""
