"""Batched KV-cache generation: engine (slots, continuous batching), forward pass, sampling."""
from .engine import Engine
from .sampling import SamplingParams, sample

__all__ = ["Engine", "SamplingParams", "sample"]
