"""Training groups built by hand with chosen behaviour log-probs (the trainer's exact ones, shifted
by a known amount), for the engine/trainer gap and truncated importance sampling tests."""
from __future__ import annotations

import torch

from aioareal.config import load_config
from aioareal.group import Completion, Example, Group, Sample
from aioareal.models import random_model
from aioareal.trainer import Trainer
from aioareal.trainer.batching import collate
from aioareal.trainer.logprobs import token_logprobs

CPU = torch.device("cpu")


def exact_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> list[float]:
    """The trainer's own log-probs of `tokens` after `prompt` (one row, nothing shared or packed)."""
    mb = collate([Sample(prompt, Completion(tokens, [0.0] * len(tokens), [0] * len(tokens)))], 0, CPU)
    with torch.no_grad():
        logp, _ = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, temperature, 2048)
    return logp[mb.loss_mask].tolist()


def groups_with_behaviour(model, shift, versions_of=lambda gid, i: 0, n_groups=2, g=4) -> list[Group]:
    """Groups whose behaviour log-probs are the model's exact ones plus shift(gid, i, j) per token j."""
    gen = torch.Generator().manual_seed(0)
    groups = []
    for gid in range(n_groups):
        group = Group(gid, [4, 5, 6], g, Example(str(gid), "q", "a"))
        for i in range(g):
            tokens = torch.randint(10, 100, (3 + i,), generator=gen).tolist()
            exact = exact_logprobs(model, [4, 5, 6], tokens)
            behav = [lp + shift(gid, i, j) for j, lp in enumerate(exact)]
            completion = Completion(tokens, behav, [versions_of(gid, i)] * len(tokens), "stop")
            group.samples.append(Sample([4, 5, 6], completion, float(i % 2)))
        groups.append(group)
    return groups


def trainer_for(objective: str, *overrides: str, version: int = 0) -> Trainer:
    config = load_config(overrides=[f"algo.objective={objective}", "algo.batch_groups=2", "algo.group_size=4",
                                    *overrides])
    trainer = Trainer(random_model("tiny", torch.float32, CPU, seed=1), config.algo, config.train, pad_id=0)
    trainer.version = version
    return trainer


def known_shift(gid: int, i: int, j: int) -> float:
    return (-1) ** j * 0.05 * (1 + gid + i + j)  # |shift| from 0.05 to 0.45, both signs
