"""`bench train --layouts`: the trainer's micro-batch layouts on the same groups, side by side.

  padded  every row prompt + completion, as wide as the longest (trainer/batching.collate);
  shared  each distinct prompt computed once, completions padded to the longest (batching.py);
  tree    each distinct prefix computed once, under an ancestor mask (prefix_tree.py).

What the tree saves depends on how alike a group's completions are, which random weights cannot
show: here each group of `--group-size` samples draws its completions from `--answers` distinct
ones (0: every completion distinct), as a policy that has learnt a short answer repeats it, as
the default run's batches (prompts of 6 tokens, completions of about 4, B=32 x G=8) do: most of
their completion positions repeat another's. Reported per layout: forward + backward seconds of
the whole batch (chunked log-probs, a token-mean loss) and the token positions it computes.
"""
from __future__ import annotations

import argparse
import random
from typing import Any

import torch
from torch import nn

from ...group import Completion, Sample
from ...trainer.batching import Layouts, MicroBatch, collate, plan_for
from ...trainer.logprobs import token_logprobs
from ..simulate.lengths import gsm8k_like_length
from .harness import alternate, build_model, environment, median_seconds, model_label, pick_device, ratio

LAYOUTS = ("padded", "shared", "tree")


def repetitive_groups(groups: int, size: int, answers: int, prompt_len: int, mean: float, cap: int, vocab: int,
                      seed: int) -> list[Sample]:
    """`groups` x `size` samples; each group's completions drawn from `answers` distinct ones (0: all distinct)."""
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        draw = lambda: [rng.randrange(vocab) for _ in range(gsm8k_like_length(rng, mean, cap))]  # noqa: E731
        pool = [draw() for _ in range(answers)]
        for _ in range(size):
            tokens = list(rng.choice(pool)) if pool else draw()
            out.append(Sample(prompt, Completion(tokens, [0.0] * len(tokens), [0] * len(tokens)),
                              advantage=rng.choice((-1.0, 1.0))))
    return out


def train_pass(model: nn.Module, mbs: list[MicroBatch], chunk: int) -> None:
    """Forward + backward of every micro-batch in its own layout (a token-mean loss), as the trainer does."""
    tokens = sum(mb.completion_tokens for mb in mbs)
    for mb in mbs:
        logp, _ = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, 1.0, chunk, mb.layout)
        (-(logp * mb.advantages[:, None]).sum() / tokens).backward()
    model.zero_grad(set_to_none=True)


def run_layouts(args: argparse.Namespace) -> dict[str, Any]:
    device = pick_device(args.device)
    model = build_model(args.model, torch.float32, device, args.seed).train()
    vocab, pad = model.config.vocab_size, model.config.pad_token_id or 0
    groups = max(1, args.samples // args.group_size)
    samples = repetitive_groups(groups, args.group_size, args.answers, args.prompt_len, args.mean_len,
                                args.max_len, vocab, args.seed)
    # Each layout on the micro-batches the trainer cuts for it: by length when padded, a group's rows
    # together when prompts are shared (batching.plan_for).
    options = {"padded": Layouts(), "shared": Layouts(share=True), "tree": Layouts(share=True, tree=True)}
    batches = {name: [collate([samples[i] for i in idx], pad, device, layouts)
                      for idx in plan_for(samples, args.budget, layouts)]
               for name, layouts in options.items()}
    print(f"bench train --layouts: {model_label(args.model)} on {device}, {groups} groups x {args.group_size}, "
          f"{args.prompt_len}-token prompts, completions mean {args.mean_len:g} cap {args.max_len}, "
          f"{args.answers or 'all'} distinct per group; micro-batches "
          + ", ".join(f"{name} {len(mbs)}" for name, mbs in batches.items()), flush=True)
    runs = alternate({name: (lambda mbs=mbs: train_pass(model, mbs, args.chunk)) for name, mbs in batches.items()},
                     args.repeats, device)
    result: dict[str, Any] = {"bench": "train_layouts", **environment(device), "model": model_label(args.model),
                              "groups": groups, "group_size": args.group_size, "answers": args.answers,
                              "prompt_len": args.prompt_len, "mean_len": args.mean_len, "max_len": args.max_len,
                              "budget": args.budget, "repeats": args.repeats}
    for name, mbs in batches.items():
        result[f"{name}_s"] = median_seconds(runs[name])
        result[f"{name}_positions"] = sum(mb.positions for mb in mbs)
    result["tree_vs_shared"] = ratio(result["shared_s"], result["tree_s"])
    result["tree_vs_padded"] = ratio(result["padded_s"], result["tree_s"])
    for name in LAYOUTS:
        print(f"  {name:<7} {1e3 * result[name + '_s']:>9.1f} ms forward + backward, "
              f"{result[name + '_positions']:>7,} positions")
    print(f"  tree: {result['tree_vs_shared']:.2f}x faster than shared prompts, "
          f"{result['tree_vs_padded']:.2f}x than padded", flush=True)
    return result

