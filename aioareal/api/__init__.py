"""The Python API: train, evaluate and talk to a policy from a script or a notebook.

    import aioareal
    run = aioareal.train("tiny", train_dataset=rows, reward_funcs=[exact], steps=100)
    run.metrics                      # a pandas DataFrame, one row a step
    run.evaluate("tiny")             # the figures of `eval tiny RUN_DIR`
    run.chat("23+45=")               # the trained policy's reply

Everything here goes through the code the command line runs (cli.py calls `run_training`): a
config is built from the same keys (keyword arguments are flags, `settings` holds any
`section.key`), checked before torch loads, and trained by run/recipe.py. What Python adds:
- data as objects: a `datasets.Dataset`, a pandas DataFrame or a list of dicts is written to
  RUN_DIR/data/*.jsonl (the run keeps what it trained on, and `--resume` from a shell finds it);
- reward functions as callables, lambdas and closures included (usercode.register): the config
  records 'python:NAME', this process holds the object;
- callbacks (`on_step`: each step's metrics row; return True to stop after that step);
- a running event loop (Jupyter): run/events.py runs the run's loop beside it, and the cell's
  interrupt stops the run after its step, with a checkpoint; `train(resume=run)` continues it.

The run comes back as a `Run` (run.py): its directory, config, metrics, samples, policy.
"""
from __future__ import annotations

from .run import Run, evaluate
from .training import train

__all__ = ["Run", "evaluate", "train"]
