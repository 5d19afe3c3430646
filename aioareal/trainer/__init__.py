"""Training: the RL step (`train_step`, trainer.py), micro-batch packing, chunked log-probs, the
objective, the optimizer."""
from .trainer import NonFiniteError, Trainer, train_step

__all__ = ["NonFiniteError", "Trainer", "train_step"]
