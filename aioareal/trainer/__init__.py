"""Training: micro-batch packing, chunked log-probs, the objective, the optimizer step."""
from .trainer import NonFiniteError, Trainer

__all__ = ["NonFiniteError", "Trainer"]
