"""Continuous-batching generation engine over a fixed pool of KV-cache slots.

Each `step()` admits waiting groups into free slots (one prefill per prompt, its K/V written
into all G slots of the group), runs one decode step over every live slot, and makes a single
host sync to learn the sampled tokens, so finished sequences free their slot at once and the
next prompt takes it. Per-slot decode state (next token, position, liveness) stays on the device.

Weights belong to the model the engine wraps. When the trainer publishes a new version the
engine `adopt`s it between steps: its stream waits for the copy's event (no host sync), and by
default every running sequence's KV cache is recomputed under the new weights (AReaL's
interruptible generation; DESIGN rule 3).

Host syncs, all of them: the `.cpu()` of each step's sampled tokens (the one the design allows);
capturing a new CUDA graph (`torch.cuda.graph` synchronizes on entry: once per batch bucket and
span, graphs.py); and `PhaseTimer.take()` reading its events, only after that `.cpu()`. Everything
else the host sends (slots, lengths, prompt tokens) goes up by pinned non-blocking copies
(upload.py), and every index write (`live[slots] = ...`, the KV cache's) is launched, not waited on.
"""
from __future__ import annotations

import contextlib
import heapq
from collections import deque

import torch
from transformers import PreTrainedModel

from ..timing import PhaseTimer
from .forward import FastForward
from .graphs import DecodeGraphs, can_use_own_generator
from .fused_sampling import fused_sample
from .sampling import SamplingParams, sample
from .sequence import Completion, GroupRequest, GroupResult, GroupState, Running
from .upload import upload, upload_padded

# With CUDA graphs the attention span is rounded up to a bucket so few graphs are captured;
# eager decoding attends over exactly the live context.
GRAPH_SPAN_BUCKET = 64
# Attention spans up to which the CPU's decode of the live slots alone pays at any live count.
SHORT_SPAN = 32


def live_decode_pays(live: int, n: int, span: int) -> bool:
    """Whether the CPU decodes only the `live` running slots of the first n (engine._decode_live)
    rather than all n. Gathering the live slots' cache rows costs about what attention over them
    does, so it pays when contexts are short or at least half the slots are done (tiny model, one
    thread: at span 16, 48 of 64 live 4.2 vs 4.9 ms a step; at span 320, 48 live 29.6 vs 20.0 ms,
    32 live 12.5 vs 19.8 ms)."""
    return live < n and (span <= SHORT_SPAN or 2 * live <= n)


class Engine:
    def __init__(self, model: PreTrainedModel, eos_ids: list[int], num_slots: int, max_len: int,
                 params: SamplingParams, seed: int = 0, cuda_graphs: bool = False,
                 recompute_kv: bool = True, compile: bool = False, timed: bool = False,
                 fuse: bool = True, fused_sampler: bool = False) -> None:
        """`fuse`: run q/k/v and gate/up as one matmul each, over fused weights the model's
        parameters are re-pointed into (fusion.py); pass False for a model that also trains.
        `fused_sampler`: the compiled sampler that reads the logits once (fused_sampling.py)."""
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.params = params
        self.sample = fused_sample if fused_sampler else sample
        self.max_len = max_len
        self.recompute_kv = recompute_kv
        self.fwd = FastForward(model, max_len, fuse=fuse)
        self.cache = self.fwd.new_cache(num_slots)
        # Compiled with symbolic batch and span, so the graph ladder's shapes share one compilation.
        self.decode_fn = torch.compile(self.fwd.decode, dynamic=True) if compile else self.fwd.decode
        self.eos_set = set(eos_ids)
        graphs = cuda_graphs and self.device.type == "cuda"
        if graphs and not can_use_own_generator():
            torch.cuda.manual_seed(seed)  # graphs then draw from the device's default generator
            self.generator = None
        else:
            self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.num_slots = num_slots
        self.free: list[int] = list(range(num_slots))
        self.waiting: deque[GroupRequest] = deque()
        self.running: dict[int, Running] = {}
        self.next_token = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        self.position = torch.zeros(num_slots, dtype=torch.long, device=self.device)
        self.live = torch.zeros(num_slots, dtype=torch.bool, device=self.device)
        self.version = 0
        self.stale_cache = False
        self.tokens_generated = 0  # total sampled tokens, for throughput
        self.timer = PhaseTimer(self.device, enabled=timed)  # seconds per phase of `step`, for metrics
        self.max_pos = 0  # the furthest next position of any running sequence
        self.graphs = (DecodeGraphs(self._decode_into, self.generator, num_slots,
                                    [self.next_token, self.position]) if graphs else None)
        if self.stream is not None:
            # The cache, the state tensors and maybe the model were just written on the caller's
            # stream (the trainer's thread builds engines for evaluation); ours must see them.
            self.stream.wait_stream(torch.cuda.current_stream(self.device))

    # -- queue -----------------------------------------------------------------------------------
    def submit(self, request: GroupRequest) -> None:
        if request.n > self.num_slots:
            raise ValueError(f"a group of {request.n} samples cannot fit in {self.num_slots} slots")
        if len(request.prompt_ids) + self.params.max_new_tokens > self.max_len:
            raise ValueError(f"prompt of {len(request.prompt_ids)} tokens + {self.params.max_new_tokens} new "
                             f"tokens exceeds the engine context of {self.max_len}")
        self.waiting.append(request)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    # -- weights ---------------------------------------------------------------------------------
    def adopt(self, version: int, ready: torch.cuda.Event | None = None) -> None:
        """Use weights of `version` from the next step on. `ready` is the copy's event: the engine's
        stream waits on it, the host does not."""
        if ready is not None and self.stream is not None:
            self.stream.wait_event(ready)
        self.version = version
        if self.running:
            self.stale_cache = self.recompute_kv

    # -- stepping --------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[GroupResult]:
        """Admit, prefill, decode one token everywhere, sync once; return the groups that finished.
        Each phase lands in `self.timer` (when the engine is `timed`)."""
        if not self.busy:
            return []
        timer = self.timer
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            if self.stale_cache:
                with timer("recompute_kv"):  # new weights mid-rollout: re-prefill running sequences
                    self._recompute_cache()
            with timer("admit", host=True):  # waiting groups take free slots
                groups, admitted = self._admit()
            with timer("prefill"):  # one forward per prompt, its K/V copied into the group's G slots
                first = self._prefill(groups, admitted) if groups else None
            with timer("decode"):
                decoded = self._decode() if self.running else None
            with timer("sync"):
                # The one device->host sync of the step: sampled tokens and their logprobs, which
                # the host needs to see which sequences finished.
                parts = [t for t in (first, decoded) if t is not None]
                host = torch.cat(parts, dim=1).cpu() if parts else None
            with timer("bookkeep", host=True):
                # Still on the engine's stream: bookkeeping clears `live` for finished slots, and
                # that write must be ordered before the next step's admission sets it again.
                return self._bookkeep(admitted, host, first is not None)

    def _admit(self) -> tuple[list[GroupState], list[Running]]:
        """Host side of admission: waiting groups that fit take slots, oldest first."""
        admitted: list[Running] = []
        groups: list[GroupState] = []
        while self.waiting and len(self.free) >= self.waiting[0].n:
            request = self.waiting.popleft()
            group = GroupState(request, [Completion() for _ in range(request.n)], request.n)
            groups.append(group)
            prompt_len = len(request.prompt_ids)
            # A sequence ends at max_new_tokens, at the context's end, or at its forced length.
            cap = min(self.params.max_new_tokens, self.max_len - prompt_len)
            for i in range(request.n):
                slot = heapq.heappop(self.free)
                limit = cap if request.lengths is None else min(cap, request.lengths[i])
                admitted.append(Running(group, i, slot, group.completions[i], prompt_len, limit,
                                        request.lengths is None))
            self.max_pos = max(self.max_pos, prompt_len)  # its first decode writes at prompt_len
        return groups, admitted

    def _prefill(self, groups: list[GroupState], admitted: list[Running]) -> torch.Tensor:
        """Prefill the admitted prompts, sample their first tokens; returns (2, len(admitted))."""
        prompts = [g.request.prompt_ids for g in groups]
        # Metadata goes up by pinned, non-blocking copies (upload.py): the host does not wait.
        lengths = upload([len(p) for p in prompts], self.device)
        tokens = upload_padded(prompts, self.device)
        copies = groups[0].request.n
        slots = upload([r.slot for r in admitted], self.device)
        if any(g.request.n != copies for g in groups):  # mixed group sizes: one prefill each
            hidden = torch.cat([self.fwd.prefill(self.cache, tokens[j:j + 1], lengths[j:j + 1],
                                                 self._slots_of(admitted, g), g.request.n).repeat(g.request.n, 1)
                                for j, g in enumerate(groups)])
        else:
            hidden = self.fwd.prefill(self.cache, tokens, lengths, slots, copies).repeat_interleave(copies, 0)
        tok, lp = self.sample(self.fwd.logits(hidden), self.params, self.generator)
        pos = upload([len(r.group.request.prompt_ids) for r in admitted], self.device)
        self.next_token[slots], self.position[slots], self.live[slots] = tok, pos, True
        for r in admitted:
            self.running[r.slot] = r
        return torch.stack([tok.to(torch.float32), lp])

    def _slots_of(self, admitted: list[Running], group: GroupState) -> torch.Tensor:
        return upload([r.slot for r in admitted if r.group is group], self.device)

    def _decode(self) -> torch.Tensor:
        n = max(self.running) + 1
        span = self.max_pos + 1  # kept by admission and bookkeeping: no pass over the sequences
        if self.graphs is not None:
            span = min(self.max_len, -(-span // GRAPH_SPAN_BUCKET) * GRAPH_SPAN_BUCKET)
            return self.graphs.run(n, span)
        if self.device.type == "cpu" and live_decode_pays(len(self.running), n, span):
            return self._decode_live(n, span)
        return self._decode_into(n, span)

    def _decode_live(self, n: int, span: int) -> torch.Tensor:
        """The CPU's decode when some of the first n slots have finished: only running slots go
        through the model (on the CPU the matmuls cost in proportion to the rows; a GPU decodes all
        n at about the cost of one, in a fixed-shape CUDA graph). Returns (2, n) like `_decode_into`,
        zeros at the finished slots, which bookkeeping never reads."""
        slots = upload(sorted(self.running), self.device)
        hidden = self.decode_fn(self.cache, self.next_token[slots], self.position[slots], span, slots)
        tok, lp = self.sample(self.fwd.logits(hidden), self.params, self.generator)
        self.next_token[slots] = tok
        self.position[slots] = (self.position[slots] + 1).clamp(max=self.max_len - 1)
        out = torch.zeros(2, n, device=self.device)
        out[:, slots] = torch.stack([tok.to(torch.float32), lp])
        return out

    def _decode_into(self, n: int, span: int) -> torch.Tensor:
        """Decode the first n slots; update next token and position in place; return (2, n)."""
        hidden = self.decode_fn(self.cache, self.next_token[:n], self.position[:n], span)
        tok, lp = self.sample(self.fwd.logits(hidden), self.params, self.generator)
        live = self.live[:n]
        self.next_token[:n] = tok
        self.position[:n] = torch.where(live, (self.position[:n] + 1).clamp(max=self.max_len - 1), 0)
        return torch.stack([tok.to(torch.float32), lp])

    def _recompute_cache(self) -> None:
        """Re-prefill every running sequence (prompt + tokens so far) under the current weights."""
        seqs = list(self.running.values())
        prefixes = [r.group.request.prompt_ids + r.completion.tokens[:-1] for r in seqs]
        lengths = upload([len(p) for p in prefixes], self.device)
        slots = upload([r.slot for r in seqs], self.device)
        self.fwd.prefill(self.cache, upload_padded(prefixes, self.device), lengths, slots)
        self.stale_cache = False

    def _bookkeep(self, admitted: list[Running], host: torch.Tensor | None, has_first: bool) -> list[GroupResult]:
        """Record the step's tokens on the host; free finished slots. This loop runs once per live
        sequence per step, so it is kept lean: on a GPU it is time the device may sit idle."""
        if host is None:
            return []
        tokens, logprobs = host[0].long().tolist(), host[1].tolist()  # host memory already: no sync
        done_slots: list[int] = []
        finished: list[GroupResult] = []
        # First tokens of newly admitted sequences come first, then one token per slot [0, n).
        offset = len(admitted) if has_first else 0
        for i, r in enumerate(admitted):
            self._append(r, tokens[i], logprobs[i], done_slots, finished)
        max_pos = 0
        for slot, r in list(self.running.items()):
            pos = self._append(r, tokens[offset + slot], logprobs[offset + slot], done_slots, finished)
            max_pos = pos if pos > max_pos else max_pos
        self.max_pos = max_pos
        if done_slots:
            self.live[upload(done_slots, self.device)] = False  # ordered on the engine's stream
        return finished

    def _append(self, r: Running, token: int, logprob: float, done_slots: list[int],
                finished: list[GroupResult]) -> int:
        """Record one token; return the sequence's next position, or -1 if it finished."""
        c = r.completion
        c.tokens.append(token)
        c.logprobs.append(logprob)
        c.versions.append(self.version)
        self.tokens_generated += 1
        length = len(c.tokens)
        if r.stop_on_eos and token in self.eos_set:
            c.finish_reason = "stop"
        elif length >= r.limit:
            c.finish_reason = "length"
        else:
            return r.prompt_len + length - 1
        del self.running[r.slot]
        heapq.heappush(self.free, r.slot)
        done_slots.append(r.slot)
        r.group.unfinished -= 1
        if r.group.unfinished == 0:
            finished.append(GroupResult(r.group.request, r.group.completions))
        return -1
