"""What the engine tests share (test_engine*.py, test_gpu.py, test_lora.py): the random tiny model,
random groups, a run of the engine to the end, and the plain reference it is checked against (a
full Hugging Face forward over prompt + completion)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from aioareal.generation import Engine, EngineOptions, SamplingParams
from aioareal.group import Completion, Group
from aioareal.models import random_model


def tiny(seed: int = 3, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
         scale: float = 1.0) -> torch.nn.Module:
    """The random tiny model. `scale` multiplies its matrices: at the default init greedy decoding
    repeats one token forever; scaled up (by 6, say) completions wander through the vocabulary and
    hit EOS ids at various lengths."""
    model = random_model("tiny", dtype, torch.device(device), seed=seed)
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.mul_(scale)
    return model


def random_groups(sizes: list[int], seed: int = 0, forced: dict[int, list[int]] | None = None) -> list[Group]:
    """One group per entry of `sizes` (its G), group ids 0, 1, ...: prompts of 2 to 13 random ids in
    [4, 100), drawn from `seed`; `forced` gives some groups forced lengths (EOS ignored)."""
    gen = torch.Generator().manual_seed(seed)
    groups = []
    for gid, size in enumerate(sizes):
        length = int(torch.randint(2, 14, (1,), generator=gen))
        prompt = torch.randint(4, 100, (length,), generator=gen).tolist()
        groups.append(Group(gid, prompt, size=size, forced_lengths=(forced or {}).get(gid)))
    return groups


StepHook = Callable[[Engine, int], None]


def generate(engine: Engine, groups: list[Group], each_step: StepHook | None = None) -> list[Group]:
    """Submit `groups`, step the engine until it is idle and return the groups in the order they
    came back; `each_step(engine, steps so far)` runs after every step. Every group comes back once."""
    for group in groups:
        engine.submit(group)
    results, steps = [], 0
    while engine.busy:
        results += engine.step()
        steps += 1
        if each_step is not None:
            each_step(engine, steps)
    assert sorted(r.group_id for r in results) == sorted(g.group_id for g in groups)
    return results


def adopt_after(step: int) -> StepHook:
    """A hook for `generate`: the engine adopts a new version (the same weights) after `step`."""
    def hook(engine: Engine, steps: int) -> None:
        if steps == step:
            engine.adopt(engine.version + 1)
    return hook


def by_group(results: list[Group]) -> dict[int, list[Completion]]:
    return {r.group_id: r.completions for r in results}


def reference_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int],
                       temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of `tokens` after `prompt` from one full forward of `model` (any module whose call
    with input_ids returns .logits: an HF model, a PeftModel), as float32 on the CPU."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, -1)
    picked = logp[len(prompt) - 1:-1].gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
    return picked.cpu()


def assert_same_completions(a: dict[int, list[Completion]], b: dict[int, list[Completion]],
                            atol: float = 1e-4, rtol: float = 1e-5) -> None:
    """The same groups, each with the same tokens, versions and finish reasons, and log-probs equal
    to float rounding."""
    assert a.keys() == b.keys()
    for gid in a:
        for x, y in zip(a[gid], b[gid], strict=True):
            assert (x.tokens, x.versions, x.finish_reason) == (y.tokens, y.versions, y.finish_reason), gid
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=atol, rtol=rtol)


# -- The scenario of the overlap and shared-prefix tests (test_engine_overlap.py, test_prefix.py) --
WANDER_EOS = [3, 5, 52]


def wandering_model(device: str | torch.device = "cpu") -> torch.nn.Module:
    """The tiny model scaled by 6: greedy completions wander through the vocabulary and hit the
    WANDER_EOS ids at various lengths."""
    return tiny(device=device, scale=6)


def mixed_groups() -> list[Group]:
    """Mixed group sizes (18 sequences: 6 slots are reused by waiting groups), two groups with
    forced lengths (EOS ignored; 40 is capped by wandering_engine's 16 new tokens)."""
    return random_groups([1, 3, 2, 4, 1, 2, 3, 2], forced={2: [1, 7], 5: [40, 3]})


def wandering_engine(overlap: bool | str, model: torch.nn.Module | None = None, slots: int = 6, greedy: bool = True,
                     **kw: object) -> Engine:
    params = SamplingParams(greedy=greedy, max_new_tokens=16)
    return Engine(model or wandering_model(), WANDER_EOS, EngineOptions(num_slots=slots, max_len=48, params=params,
                                                                        seed=1, overlap=overlap, **kw))


def run_to_end(engine: Engine, groups: list[Group],
               each_step: StepHook | None = None) -> tuple[dict[int, list[Completion]], list[int]]:
    """`generate`, as {group_id: completions} and the group ids in the order they came back."""
    results = generate(engine, groups, each_step)
    return by_group(results), [r.group_id for r in results]


def new_weights_after(step: int) -> StepHook:
    """A hook for `generate`: after `step`, the engine's weights change (really: seeded noise) and
    it adopts them as a new version."""
    def hook(engine: Engine, steps: int) -> None:
        if steps == step:
            with torch.no_grad():
                gen = torch.Generator().manual_seed(9)
                for p in engine.model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen) * 0.02)
            engine.adopt(engine.version + 1)
    return hook
