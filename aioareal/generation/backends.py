"""Which backend generates (`generation.backend`: engine, hf or auto), and the start-up check of its
log-probs against the model's own forward, so no run trains on a silently different model
(docs/models.md#backends).

`HFEngine`, the HF fallback backend: the engine's interface over the engine's own
`Scheduler`, every logit from the model's own `forward` (slower, but the log-probs are the model's).

Sequences admitted in one step with equally long prompts form a *cohort*: one prefill, then equally
long contexts ever after, so a cohort decodes as one batch over one `DynamicCache` with no padding or
mask; finished rows are dropped from it. A new version re-prefills every cohort (`recompute_kv`).
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from ..errors import UserError
from ..group import Group
from ..timing import PhaseTimer
from .engine import Engine, EngineOptions
from .forward import unsupported_reason
from .sampling import sample
from .scheduler import QueueFront, Running, Scheduler, StepOutput, TurnRequest

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
    for row in group.samples:
        ids = torch.tensor([list(prompt_ids) + row.completion.tokens], device=model.device)
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float() / temperature
        chosen = ids[0, len(prompt_ids):, None]
        reference = logits.log_softmax(-1).gather(-1, chosen).squeeze(-1).cpu()
        gaps.append((reference - torch.tensor(row.completion.logprobs)).abs().max().item())
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


@dataclass
class Cohort:
    """Sequences admitted together: equal context lengths, one cache with one row each."""

    rows: list[Running]
    cache: DynamicCache
    next_tokens: torch.Tensor  # (rows,) sampled, recorded by the host, not yet in the cache


class HFEngine(QueueFront):
    """The engine's interface over the model's own forward (module docstring)."""

    def __init__(self, model: PreTrainedModel, eos_ids: list[int], options: EngineOptions) -> None:
        o = options
        num_slots, max_len, params, seed, recompute_kv, timed = (o.num_slots, o.max_len, o.params, o.seed,
                                                                 o.recompute_kv, o.timed)
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.params, self.max_len, self.recompute_kv = params, max_len, recompute_kv
        self.num_slots = num_slots
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.sched = Scheduler(num_slots, eos_ids, max_len, params.max_new_tokens, o.stop)
        self.cohorts: list[Cohort] = []
        self.version = 0
        self.stale_cache = False
        self.timer = PhaseTimer(self.device, enabled=timed)
        # transformers 5 names the cache argument `cache`; earlier versions `past_key_values`.
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        # Models outside transformers' attention interface (MPT, Bloom's ALiBi) build their masks and
        # positions from an explicit attention mask and are wrong or fail without one.
        self.explicit_mask = not getattr(model, "_supports_attention_backend", True)
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    # -- weights ---------------------------------------------------------------------------------
    def adopt(self, version: int, ready: torch.cuda.Event | None = None) -> None:
        """Weights of `version` from the next step on (the copy already went into the parameters)."""
        if ready is not None and self.stream is not None:
            self.stream.wait_event(ready)
        self.version = version
        if self.running:
            self.stale_cache = self.recompute_kv

    def idle(self) -> None:
        """Nothing held between batches but the caches of running cohorts (none when idle)."""

    # -- stepping --------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Group]:
        """Admit, prefill, decode one token in every cohort, record; returns the groups that finished."""
        if not self.busy:
            return []
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            if self.stale_cache:
                with self.timer("recompute_kv"):
                    for cohort in self.cohorts:
                        self._recompute(cohort)
                self.stale_cache = False
            with self.timer("admit", host=True):
                units, admitted = self.sched.admit()
            with self.timer("prefill"):
                first = self._prefill(units, admitted)
            snapshot = list(self.running.values())
            with self.timer("decode"):
                decoded = self._decode()
            with self.timer("sync"):  # the step's one device->host sync, as the plain engine's
                host = torch.cat([first, decoded], dim=1).cpu()
            output = StepOutput(host, None, admitted, snapshot, self.version, True)
            with self.timer("bookkeep", host=True):
                finished = self.sched.bookkeep(output, None)
                self.sched.paused = []  # a stop string ended them: their rows leave their cohorts below
                self._drop_finished()
        return finished

    def _forward(self, tokens: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """The model's own forward over tokens (n, T) continuing `cache`; the last position's logits (n, V)."""
        extra: dict = {self.cache_arg: cache}
        if self.explicit_mask:  # every row is whole: a mask of ones over the cache and the new tokens
            extra["attention_mask"] = torch.ones(tokens.shape[0], cache.get_seq_length() + tokens.shape[1],
                                                 dtype=torch.long, device=self.device)
        out = self.model(input_ids=tokens, use_cache=True, logits_to_keep=1, **extra)
        return out.logits[:, -1]

    def _new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    def _prefill(self, units: list[Group | TurnRequest], admitted: list[Running]) -> torch.Tensor:
        """One forward, and one cohort, per prompt length over the admitted units; each unit's rows
        sample their first tokens from its logits. Returns (2, len(admitted)) in `admitted`'s order."""
        out = torch.zeros(2, len(admitted), device=self.device)
        by_length: dict[int, list[tuple[Group | TurnRequest, int]]] = {}
        row = 0
        for unit in units:  # `admitted` holds each unit's rows consecutively, in the order of `units`
            by_length.setdefault(len(unit.prompt_ids), []).append((unit, row))
            row += unit.size
        for same in by_length.values():
            cache = self._new_cache()
            logits = self._forward(torch.tensor([u.prompt_ids for u, _ in same], device=self.device), cache)
            expand = torch.tensor([i for i, (u, _) in enumerate(same) for _ in range(u.size)], device=self.device)
            if len(expand) > len(same):
                cache.batch_select_indices(expand)  # each unit's row once per sample
            tok, lp = sample(logits[expand], self.params, self.generator)
            positions = [p for u, first in same for p in range(first, first + u.size)]
            self.cohorts.append(Cohort([admitted[p] for p in positions], cache, tok))
            out[:, positions] = torch.stack([tok.to(torch.float32), lp])
        for r in admitted:
            self.running[r.slot] = r
        return out

    def _decode(self) -> torch.Tensor:
        """One token for every cohort's rows, (2, max slot + 1) with each row at its slot."""
        n = max(self.running) + 1 if self.running else 0
        out = torch.zeros(2, n, device=self.device)
        for cohort in self.cohorts:
            logits = self._forward(cohort.next_tokens[:, None], cohort.cache)
            tok, lp = sample(logits, self.params, self.generator)
            cohort.next_tokens = tok
            slots = torch.tensor([r.slot for r in cohort.rows], device=self.device)
            out[:, slots] = torch.stack([tok.to(torch.float32), lp])
        return out

    def _drop_finished(self) -> None:
        """Rows whose sequence ended leave their cohort's cache; an empty cohort goes."""
        kept = []
        for cohort in self.cohorts:
            keep = [i for i, r in enumerate(cohort.rows) if not r.done]
            if len(keep) < len(cohort.rows) and keep:
                index = torch.tensor(keep, device=self.device)
                cohort.cache.batch_select_indices(index)
                cohort.rows = [cohort.rows[i] for i in keep]
                cohort.next_tokens = cohort.next_tokens[index]
            if keep:
                kept.append(cohort)
        self.cohorts = kept

    def _recompute(self, cohort: Cohort) -> None:
        """Re-prefill the cohort's contexts (prompt + tokens so far) under the current weights."""
        contexts = [r.group.prompt_ids + r.completion.tokens[:-1] for r in cohort.rows]
        cohort.cache = self._new_cache()
        self._forward(torch.tensor(contexts, device=self.device), cohort.cache)


Backend = Engine | HFEngine
