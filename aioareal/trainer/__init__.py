"""Training: the RL step (step.py), micro-batch packing, chunked log-probs, the objective, the optimizer."""
from .step import train_step
from .trainer import NonFiniteError, Trainer

__all__ = ["NonFiniteError", "Trainer", "train_step"]
