"""Continuous-batching generation engine over a fixed pool of KV-cache slots.

Each `step()` admits waiting groups and episodes' turns (scheduler.py) into free slots (one prefill per
prompt, its K/V written into all G slots of the group), decodes one token in every live slot, and
reads the tokens on the host, which records them and frees finished slots. Liveness stays on the
device, which ends a slot at EOS or its length limit (scheduler.py); the host ends it at a stop string.
With `overlap` (on by default on CUDA) step t+1 is launched before the host reads step t's tokens.

A published version is `adopt`ed between steps: the stream waits on the copy's event, and by default
running sequences' KV caches are recomputed under the new weights (docs/architecture.md rule 3).
Each token carries the version of the weights that sampled it.

Host syncs, all of them: one per step for its tokens (with overlap, the previous step's copy event);
with overlap, one more when a version is adopted with `recompute_kv`; one per new CUDA graph
(`DecodeGraphs`, below). Everything else goes up by pinned non-blocking copies (scheduler.py upload).

`DecodeGraphs`: CUDA graphs for decode steps, captured lazily per (batch bucket, attention span).

A replay runs the whole decode (layers, sampling, state update) in one launch; without it launch
latency dominates small-model decoding. Graphs hold raw pointers, so everything they read lives in
persistent buffers and weight sync copies in place (docs/architecture.md rule 5).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ..config.schema import GenerationConfig
from ..group import Group
from ..timing import PhaseTimer
from .family_forward import build_forward
from .forward import KVCache
from .prefix import PrefixLayout, layout_of
from .sampling import (  # noqa: F401
    GRAPH_SPAN_BUCKET,
    SHORT_SPAN,
    SamplingParams,
    fused_sampler_enabled,
    live_decode_pays,
    resolve_overlap,
    sampler_for,
)
from .scheduler import (
    QueueFront,
    Running,
    Scheduler,
    SlotLimits,
    StepOutput,
    StopStrings,
    TurnRequest,
    same_size_runs,
    to_host,
    upload,
    upload_padded,
)


@dataclass(frozen=True)
class EngineOptions:
    """How an engine is sized and how it decodes (`engine_options` builds it from the config).
    `fuse`: forward.py; False for a model that also trains. `overlap`: True, False or "auto" (CUDA).
    `fused_sampler`: sampling.py `fused_sample`. `shared_prefix`: prefix.py, eager only. The HF
    fallback reads the sizes, `params`, `seed`, `recompute_kv`, `timed` and `stop`."""

    num_slots: int  # sequences decoded at once (KV-cache slots)
    max_len: int  # prompt + completion tokens a slot holds
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    cuda_graphs: bool = False
    recompute_kv: bool = True  # docs/architecture.md#rules, rule 3
    compile: bool = False
    timed: bool = False  # record each phase's seconds for the metrics
    fuse: bool = True
    overlap: bool | str = "auto"
    fused_sampler: bool = False
    shared_prefix: bool = False
    stop: StopStrings | None = None  # strings that end a plain group's sequence (eval's lm-eval protocol)
    # Ids every prompt starts with (eval's few-shot context): K/V computed once, the rest prefilled.
    prompt_prefix: tuple[int, ...] = ()


def engine_options(g: GenerationConfig, num_slots: int, max_len: int, seed: int, device: torch.device,
                   timed: bool = True) -> EngineOptions:
    """A training engine's options from generation.*: `num_slots` when generation.num_slots is 0,
    `seed` the sampling seed (one per torchrun rank), `device` the generator's."""
    return EngineOptions(g.num_slots or num_slots, max_len, SamplingParams(g.temperature, g.top_p, g.max_new_tokens),
                         seed=seed, cuda_graphs=g.cuda_graphs, recompute_kv=g.recompute_kv, compile=g.compile,
                         timed=timed, overlap=g.overlap, fused_sampler=fused_sampler_enabled(g.fused_sampler, device),
                         shared_prefix=g.shared_prefix)


class Engine(QueueFront):
    def __init__(self, model: PreTrainedModel, eos_ids: list[int], options: EngineOptions) -> None:
        o = options
        num_slots, max_len, params, seed = o.num_slots, o.max_len, o.params, o.seed
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.params = params
        self.sample = sampler_for(self.device, o.fused_sampler)
        self.max_len = max_len
        self.recompute_kv = o.recompute_kv
        self.overlap = resolve_overlap(o.overlap, self.device)
        self.fwd = build_forward(model, max_len, fuse=o.fuse, compiled=o.compile)
        self.cache: KVCache | None = self.fwd.new_cache(num_slots)
        # Compiled with symbolic batch and span, so the graph ladder's shapes share one compilation.
        self.decode_fn = torch.compile(self.fwd.decode, dynamic=True) if o.compile else self.fwd.decode
        graphs = o.cuda_graphs and self.device.type == "cuda"
        if graphs and not can_use_own_generator():
            torch.cuda.manual_seed(seed)  # graphs then draw from the device's default generator
            self.generator = None
        else:
            self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.num_slots = num_slots
        self.sched = Scheduler(num_slots, eos_ids, max_len, params.max_new_tokens, o.stop)
        self.next_token = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        self.position = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        self.live = torch.zeros(num_slots, dtype=torch.bool, device=self.device)
        self.limits = SlotLimits(num_slots, eos_ids, self.device)
        self.pending: StepOutput | None = None  # with overlap: the launched step not yet read
        self.version = 0
        self.stale_cache = False
        self.timer = PhaseTimer(self.device, enabled=o.timed)  # seconds per phase of `step`, for metrics
        state = [self.next_token, self.position, self.live, self.limits.remaining]
        self.graphs = DecodeGraphs(self._decode_into, self.generator, num_slots, state) if graphs else None
        self.shared_prefix = o.shared_prefix and not graphs and not o.compile and self.fwd.shares_prefix
        self.layout: PrefixLayout | None = None  # the last shared-prefix layout, reused while unchanged
        self.prompt_prefix = list(o.prompt_prefix)
        self.prefix_kv: KVCache | None = None  # the prompt prefix's K/V under this version's weights
        if self.stream is not None:
            # The cache, the state tensors and maybe the model were just written on the caller's
            # stream (the trainer's thread builds engines for evaluation); ours must see them.
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    # -- weights ---------------------------------------------------------------------------------
    def adopt(self, version: int, ready: torch.cuda.Event | None = None) -> None:
        """Use weights of `version` from the next step on; the stream waits on `ready` (the copy's
        event), the host does not. A step already in flight keeps the old weights."""
        if ready is not None and self.stream is not None:
            self.stream.wait_event(ready)
        self.version = version
        self.fwd.linear.drop()  # weights packed for the CPU (forward.py) are the old version's
        self.prefix_kv = None  # and so is the prompt prefix's K/V
        if self.running:
            self.stale_cache = self.recompute_kv

    def idle(self) -> None:
        """Nothing left to decode: drop the packed weights (made again at the next step) and, without
        CUDA graphs (which hold its addresses), the KV cache, whose memory the trainer's step then
        uses in sync mode (docs/log/2026-11-memory-4gib.md)."""
        self.fwd.linear.drop()
        if self.graphs is None and not self.running:
            self.cache = None

    # -- stepping --------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Group]:
        """Admit, prefill, decode one token everywhere; read a step's tokens (with overlap, the
        previous step's) and return the groups that finished. Phases land in `self.timer`."""
        if not self.busy:
            return []
        timer = self.timer
        finished: list[Group] = []
        if self.cache is None:  # let go of by `idle`
            self.cache = self.fwd.new_cache(self.num_slots)
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            if self.stale_cache:
                if self.pending is not None:  # the recompute needs the in-flight step's tokens
                    finished += self._read(self.pending, None)
                    self.pending = None
                if self.running:
                    with timer("recompute_kv"):  # new weights mid-rollout: re-prefill running sequences
                        self._recompute_cache()
                self.stale_cache = False
            with timer("admit", host=True):  # waiting groups take free slots
                groups, admitted = self.sched.admit()
            with timer("prefill"):  # one forward per prompt, its K/V copied into the group's G slots
                first = self._prefill(groups, admitted) if groups else None
            snapshot = list(self.running.values())
            with timer("decode"):
                decoded = self._decode() if self.running else None
            launched = self._launch_copy(first, decoded, admitted, snapshot)
            if self.overlap:
                previous, self.pending = self.pending, launched
                self.sched.max_pos += 1  # the next launch writes one further; reading `previous` refines it
            else:
                previous = launched
            if previous is not None:
                finished += self._read(previous, self.pending)
            if not self.running:
                self.pending = None  # nothing left to read in it: every sequence it holds finished
        return finished

    def _launch_copy(self, first: torch.Tensor | None, decoded: torch.Tensor | None,
                     admitted: list[Running], running: list[Running]) -> StepOutput | None:
        """The step's tokens and logprobs on their way to the host (scheduler.py StepOutput)."""
        parts = [t for t in (first, decoded) if t is not None]
        if not parts:
            return None
        out = torch.cat(parts, dim=1)  # a fresh tensor: a graph's output buffer is rewritten by its next replay
        if self.overlap:
            host, event = to_host(out, self.stream)
        else:
            with self.timer("sync"):
                # The step's one host sync: which sequences finished decides the next admission.
                host, event = out.cpu(), None
        return StepOutput(host, event, admitted, running, self.version, decoded is not None)

    def _read(self, output: StepOutput, in_flight: StepOutput | None) -> list[Group]:
        """Wait for a step's tokens and record them; `in_flight` is the step launched after it."""
        with self.timer("sync", host=True) if self.overlap else contextlib.nullcontext():
            output.wait()  # with overlap the host sync of the step: on the previous step's copy only
        with self.timer("bookkeep", host=True):
            finished = self.sched.bookkeep(output, in_flight)
        if self.sched.paused:  # a stop string ended them: the device's liveness rule cannot see text
            self.live[upload(self.sched.paused, self.device)], self.sched.paused = False, []
        return finished
    def _prefill(self, groups: list[Group | TurnRequest], admitted: list[Running]) -> torch.Tensor:
        """Prefill the admitted prompts, one forward per group size (an episode's later turns are
        single sequences beside groups of G), sample their first tokens; returns (2, len(admitted))."""
        slots = upload([r.slot for r in admitted], self.device)
        parts = [self._prefill_part(units, slots[a:b]) for units, a, b in same_size_runs(groups)]
        hidden = parts[0] if len(parts) == 1 else torch.cat(parts)
        tok, lp = self.sample(self.fwd.logits(hidden), self.params, self.generator)
        # Positions, length limits and EOS flags in one upload: (3, len(admitted)).
        meta = upload([[r.context_len for r in admitted], [r.limit - r.turn_start for r in admitted],
                       [int(r.stop_on_eos) for r in admitted]], self.device)
        live = self.limits.start(slots, tok, meta[1], meta[2].bool())  # a first token may end it
        self.next_token[slots], self.position[slots], self.live[slots] = tok, meta[0], live
        for r in admitted:
            self.running[r.slot] = r
        return torch.stack([tok.to(torch.float32), lp])

    def _prefill_part(self, units: list[Group | TurnRequest], slots: torch.Tensor) -> torch.Tensor:
        """One forward over units of one size, K/V into their `slots`; their rows' hidden states."""
        prompts = [g.prompt_ids for g in units]
        start = self._place_prefix(prompts, slots)
        prompts = [p[start:] for p in prompts]
        lengths = upload([len(p) for p in prompts], self.device)
        tokens, copies = upload_padded(prompts, self.device), units[0].size
        return self.fwd.prefill(self.cache, tokens, lengths, slots, copies, start).repeat_interleave(copies, 0)

    def _place_prefix(self, prompts: list[list[int]], slots: torch.Tensor) -> int:
        """Where every prompt starts with (and goes past) `prompt_prefix`, copy the prefix's K/V
        (computed once per version) into their slots and return its length; otherwise 0."""
        p = len(self.prompt_prefix)
        if not p or any(len(ids) <= p or ids[:p] != self.prompt_prefix for ids in prompts):
            return 0
        if self.prefix_kv is None:
            self.prefix_kv = self.fwd.new_cache(1)
            ids = upload_padded([self.prompt_prefix], self.device)
            self.fwd.prefill(self.prefix_kv, ids, upload([p], self.device), upload([0], self.device))
        for i in range(len(self.cache.k)):
            self.cache.k[i][slots, :p] = self.prefix_kv.k[i][0, :p]
            self.cache.v[i][slots, :p] = self.prefix_kv.v[i][0, :p]
        return p

    def _decode(self) -> torch.Tensor:
        n = max(self.running) + 1
        # Kept by admission and bookkeeping: no pass over the sequences.
        span = min(self.max_len, self.sched.max_pos + 1)
        if self.graphs is not None:
            span = min(self.max_len, -(-span // GRAPH_SPAN_BUCKET) * GRAPH_SPAN_BUCKET)
            return self.graphs.run(n, span)
        if self.shared_prefix or self.device.type == "cpu" and live_decode_pays(len(self.running), n, span):
            return self._decode_live(n, span)
        return self._decode_into(n, span)

    def _decode_live(self, n: int, span: int) -> torch.Tensor:
        """Decode only the running slots of the first n (the CPU's path: its matmuls cost per row),
        and the shared-prefix decode. Returns (2, n) like `_decode_into`, zeros at finished slots
        (never read). With overlap a slot that finished in the step before decodes once more and
        stays not live."""
        if self.shared_prefix:
            self.layout = layout_of(self.running, self.device, self.layout)
            slots = self.layout.rows
            hidden = self.fwd.decode(self.cache, self.next_token[slots], self.position[slots], span, prefix=self.layout)
        else:
            slots = upload(sorted(self.running), self.device)
            hidden = self.decode_fn(self.cache, self.next_token[slots], self.position[slots], span, slots)
        tok, lp = self.sample(self.fwd.logits(hidden), self.params, self.generator)
        self.next_token[slots] = tok
        self.position[slots] = (self.position[slots] + 1).clamp(max=self.max_len - 1)
        self.limits.advance(self.live, tok, slots)
        out = torch.zeros(2, n, device=self.device)
        out[:, slots] = torch.stack([tok.to(torch.float32), lp])
        return out

    def _decode_into(self, n: int, span: int) -> torch.Tensor:
        """Decode the first n slots; update next token, position and liveness in place (all of it
        inside the CUDA graph when graphs are on); return (2, n)."""
        hidden = self.decode_fn(self.cache, self.next_token[:n], self.position[:n], span)
        tok, lp = self.sample(self.fwd.logits(hidden), self.params, self.generator)
        live = self.live[:n]
        self.next_token[:n] = tok
        self.position[:n] = torch.where(live, (self.position[:n] + 1).clamp(max=self.max_len - 1), 0)
        self.limits.advance(self.live, tok, slice(0, n))
        return torch.stack([tok.to(torch.float32), lp])

    def _recompute_cache(self) -> None:
        """Re-prefill every running sequence (prompt + tokens so far) under the current weights."""
        seqs = list(self.running.values())
        prefixes = [r.group.prompt_ids + r.completion.tokens[:-1] for r in seqs]
        lengths = upload([len(p) for p in prefixes], self.device)
        slots = upload([r.slot for r in seqs], self.device)
        self.fwd.prefill(self.cache, upload_padded(prefixes, self.device), lengths, slots)
        self.stale_cache = False


# Capture in thread-local mode: the trainer thread keeps launching its own work meanwhile.
CAPTURE_MODE = "thread_local"


def can_use_own_generator() -> bool:
    """Graphs can draw from a private generator only where PyTorch can register it with a graph."""
    return hasattr(torch.cuda.CUDAGraph, "register_generator_state")


class DecodeGraphs:
    def __init__(self, decode: Callable[[int, int], torch.Tensor], generator: torch.Generator | None,
                 num_slots: int, state: list[torch.Tensor]) -> None:
        self.decode = decode
        self.generator = generator
        self.ladder = sorted({min(num_slots, 1 << i) for i in range(num_slots.bit_length() + 1)})
        self.state = state  # tensors a warm-up run mutates, restored before capture
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def bucket(self, n: int) -> int:
        return next(b for b in self.ladder if b >= n)

    def run(self, n: int, span: int) -> torch.Tensor:
        key = (self.bucket(n), span)
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        graph, out = self.graphs[key]
        graph.replay()
        return out

    def _capture(self, batch: int, span: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # An eager warm-up lets kernels pick their algorithms outside the capture. It writes the K/V
        # the replay writes again; the decode state and the RNG are restored, so a seeded run samples
        # the same tokens with graphs as without.
        saved = [t.clone() for t in self.state]
        rng = self.generator.get_state() if self.generator is not None else torch.cuda.get_rng_state()
        self.decode(batch, span)
        for t, s in zip(self.state, saved):
            t.copy_(s)
        if self.generator is not None:
            self.generator.set_state(rng)
        else:
            torch.cuda.set_rng_state(rng)
        graph = torch.cuda.CUDAGraph()
        if self.generator is not None:
            graph.register_generator_state(self.generator)
        # A host sync: `torch.cuda.graph` synchronizes the device on entry. Once per new (batch
        # bucket, span) key, so a run pays it a handful of times while the span grows, then never.
        with torch.cuda.graph(graph, pool=self.pool, stream=torch.cuda.current_stream(),
                              capture_error_mode=CAPTURE_MODE):
            out = self.decode(batch, span)
        self.pool = graph.pool()
        return graph, out
