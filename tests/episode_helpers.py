"""Hand-built multi-turn samples (test_episode_masks.py, test_episodes.py): a prompt, then the model's
turns and the world's observations interleaved, with the record's placeholders where the world wrote."""
from __future__ import annotations

import random

from aioareal.group import MODEL, OBS_LOGPROB, OBS_VERSION, Completion, Sample, Turn


def episode(prompt: list[int], segments: list[tuple[str, list[int]]], version: int = 0,
            logprob: float = -1.0, reward: float = 0.0) -> Sample:
    """A sample whose completion is `segments` in order, each (role, tokens): MODEL's tokens carry
    `logprob` and `version`, the world's the placeholders."""
    c = Completion(finish_reason="stop")
    for role, tokens in segments:
        start = len(c.tokens)
        c.tokens += tokens
        if role == MODEL:
            c.logprobs += [logprob] * len(tokens)
            c.versions += [version] * len(tokens)
        else:
            c.logprobs += [OBS_LOGPROB] * len(tokens)
            c.versions += [OBS_VERSION] * len(tokens)
        c.turns.append(Turn(role, "", start, len(c.tokens)))
    return Sample(prompt, c, reward)


def random_episode(rng: random.Random, prompt: list[int], turns: int, logprob: float = -1.0) -> Sample:
    """Model turns of 1 to 5 tokens with observations of 1 to 4 tokens between them."""
    segments: list[tuple[str, list[int]]] = []
    for i in range(turns):
        if i:
            segments.append(("tool", [rng.randrange(3, 100) for _ in range(rng.randint(1, 4))]))
        segments.append((MODEL, [rng.randrange(3, 100) for _ in range(rng.randint(1, 5))]))
    return episode(prompt, segments, logprob=logprob)


def model_positions(s: Sample) -> list[int]:
    """Indices into the completion's tokens that the model sampled."""
    mask = s.completion.model_mask()
    return list(range(len(s.tokens))) if mask is None else [i for i, m in enumerate(mask) if m]
