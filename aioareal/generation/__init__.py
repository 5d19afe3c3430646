"""Batched KV-cache generation: engine (slots, continuous batching), forward pass, sampling."""
from .engine import Engine
from .sampling import SamplingParams, sample
from .sequence import Completion, GroupRequest, GroupResult

__all__ = ["Completion", "Engine", "GroupRequest", "GroupResult", "SamplingParams", "sample"]
