"""The supervised loss of the `sft` stage (run/sft.py) and the tiny model's warm-start (run/warmup.py):
the next-token loss on a demonstration's completion tokens only, its prompt context, never a target."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .logprobs import token_logprobs

# Above this many logits (1 GiB in fp32) a micro-batch's loss takes the trainer's chunked head, so a
# 262k vocabulary (Gemma) never holds them all; below it the plain forward's (SmolLM2's 4 x 640 tokens).
FULL_LOGITS = 1 << 28


@dataclass
class Demo:
    prompt: list[int]
    completion: list[int]  # ends in EOS
    taught: list[bool] | None = None  # per completion token, whether it is a target (a tool's result is not)


def completion_loss(model: Any, demos: list[Demo], device: torch.device) -> tuple[torch.Tensor, int]:
    """The summed negative log-likelihood of the completions' taught tokens, and how many there are."""
    rows = [d.prompt + d.completion for d in demos]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.zeros(len(rows), width - 1, dtype=torch.bool)  # position t predicts token t + 1
    for i, (d, row) in enumerate(zip(demos, rows)):
        ids[i, :len(row)] = torch.tensor(row)
        attention[i, :len(row)] = 1
        targets[i, len(d.prompt) - 1:len(row) - 1] = True if d.taught is None else torch.tensor(d.taught)
    ids, attention, targets = ids.to(device), attention.to(device), targets.to(device)
    if ids.numel() * model.config.vocab_size > FULL_LOGITS:  # a 262k vocabulary: the head in chunks
        logp, _ = token_logprobs(model, ids, attention, targets)
        return -logp.sum(), int(targets.sum())
    # Right padding after every row's tokens cannot reach them through causal attention: no mask.
    logits = model(ids).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return -(logp * targets).sum(), int(targets.sum())
