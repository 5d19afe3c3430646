"""Batched KV-cache generation: engine (slots, continuous batching), forward pass, sampling."""
from .engine import Engine, EngineOptions, engine_options
from .sampling import SamplingParams, sample

__all__ = ["Engine", "EngineOptions", "engine_options", "SamplingParams", "sample"]
