"""Which backend generates (`generation.backend`: engine, hf or auto), and the start-up check of its
log-probs against the model's own forward, so no run trains on a silently different model
(docs/models.md#backends).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ..errors import UserError
from ..group import Group
from .engine import Engine, EngineOptions
from .families import unsupported_reason
from .hf_backend import HFEngine

Backend = Engine | HFEngine
BACKENDS = ("auto", "engine", "hf")
CHECK_TOKENS, CHECK_SAMPLES = 8, 2  # the start-up check: 2 samples of 8 tokens each


def choose(model: PreTrainedModel, requested: str, max_len: int | None = None) -> tuple[str, str | None]:
    """("engine" | "hf", why the engine is not used or None); refuses `engine` where it is not exact
    (for a context of `max_len` tokens, where a RoPE's frequencies depend on the length)."""
    reason = unsupported_reason(model.config, max_len)
    if requested == "engine" and reason is not None:
        raise UserError(f"generation.backend=engine: model_type {model_type(model)}: {reason}; "
                        "use generation.backend=auto or hf")
    if requested == "hf":
        return "hf", "generation.backend=hf"
    return ("engine", None) if reason is None else ("hf", reason)


def model_type(model: PreTrainedModel) -> str:
    return getattr(model.config, "model_type", "?")


def fallback_line(model: PreTrainedModel, reason: str) -> str:
    return f"generation: model_type {model_type(model)} runs on the HF fallback backend (slower): {reason}"


def make_engine(model: PreTrainedModel, eos_ids: list[int], options: EngineOptions, backend: str = "auto") -> Backend:
    """The backend `backend` resolves to for `model`, built with `options`."""
    kind, _ = choose(model, backend, options.max_len)
    return (HFEngine if kind == "hf" else Engine)(model, eos_ids, options)


def gap_bound(dtype: torch.dtype) -> float:
    """The start-up check's bound in nats: fp32 agrees to ~1e-5, 16-bit differs by its rounding."""
    return 1e-3 if dtype == torch.float32 else 0.25


@torch.inference_mode()
def startup_gap(backend: Backend, model: PreTrainedModel, prompt_ids: list[int]) -> float:
    """Max |behaviour log-prob - the model's own forward's| over a few tokens the backend samples
    after `prompt_ids`. Leaves the backend's counters and timings as they were."""
    size = min(CHECK_SAMPLES, backend.num_slots)
    length = min(CHECK_TOKENS, backend.params.max_new_tokens, backend.max_len - len(prompt_ids))
    before = backend.sched.tokens_generated, backend.sched.decode_tokens
    group = Group(-1, list(prompt_ids), size, forced_lengths=[length] * size)
    backend.submit(group)
    while backend.busy:
        backend.step()
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)  # once, at start-up: the backend's stream is done
    backend.sched.tokens_generated, backend.sched.decode_tokens = before
    backend.timer.take()
    temperature = backend.params.temperature
    gaps = []
    for sample in group.samples:
        ids = torch.tensor([list(prompt_ids) + sample.completion.tokens], device=model.device)
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float() / temperature
        chosen = ids[0, len(prompt_ids):, None]
        reference = logits.log_softmax(-1).gather(-1, chosen).squeeze(-1).cpu()
        gaps.append((reference - torch.tensor(sample.completion.logprobs)).abs().max().item())
    return max(gaps)


def checked(backend: Backend, model: PreTrainedModel, prompt_ids: list[int], requested: str,
            rebuild: Callable[[], HFEngine], log: Callable[[str], None]) -> Backend:
    """The backend to train with, after the start-up check: `backend` if its log-probs agree with
    the model's forward; under `auto` an engine that does not is replaced by `rebuild()` (the
    fallback), which must agree in turn; otherwise the run is refused with one line."""
    bound = gap_bound(model.get_input_embeddings().weight.dtype)
    what = "engine" if isinstance(backend, Engine) else "HF fallback backend"
    try:
        gap = startup_gap(backend, model, prompt_ids)
    except (RuntimeError, TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
        # A model whose own code breaks on this path (a family transformers half supports): one line.
        failure = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        message, finding = (f"generation: model_type {model_type(model)}: the {what} cannot run this model "
                            f"({failure})"), f"the engine failed the start-up check ({failure})"
    else:
        if gap <= bound:
            return backend
        message = (f"generation: model_type {model_type(model)}: the {what}'s log-probs differ from the model's "
                   f"own forward by {gap:.3g} nats (bound {bound:g} for its dtype)")
        finding = f"the start-up check found the engine's log-probs {gap:.3g} nats off"
    if requested != "auto" or not isinstance(backend, Engine):
        raise UserError(message + ("; use generation.backend=auto or hf" if isinstance(backend, Engine) else ""))
    log(fallback_line(model, finding))
    return checked(rebuild(), model, prompt_ids, "hf", rebuild, log)
