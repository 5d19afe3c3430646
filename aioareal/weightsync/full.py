"""Weight sync from the trainer's master weights to the generator's copy (docs/architecture.md rule 5).

`publish` (trainer thread) copies every parameter into a staging buffer on the generator's device,
non-blocking on a dedicated stream, records an event and bumps the version. `apply` (generator
thread, between engine steps) makes the generator's stream wait on that event and copies staging into
the live parameters in place (never rebinding: CUDA graphs hold raw pointers). Neither side waits on
the host. Staging lets the trainer publish without waiting for the generator's step boundary (a
whole batch away in one-step mode) while the generator never sees half a model.

Unstaged (`staged=False`, one thread in sync mode: run/build.py): the generator is idle at every
publish and adopts before its next step, so `publish` writes the live parameters and no staging copy
sits through the training step's peak (docs/log/2026-11-memory-4gib.md). On the CPU copies are
synchronous and a lock orders the two threads. Under torchrun each FSDP2 shard is gathered whole
(`full_tensor`, every rank in the same order) just before its copy: one full parameter at a time.

With LoRA (`LoraSync`, at the end): the generator runs plain merged weights, never peft.

`LoraSync` keeps `WeightSync`'s contract; only what is staged differs: per adapted matrix, `publish` computes
`W + (alpha/r) * B @ A` on the trainer's device (fp32 sum, cast to the generator's dtype). The other
parameters are the base's and never change, so they are never copied. Merging on the trainer's
side keeps peft out of the engine's hot loop (`bench train --lora-rank` prints the bytes moved).
"""
from __future__ import annotations

import threading

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..models.lora import adapted_modules, merged_weight


def _stream(device: torch.device) -> torch.cuda.Stream | None:
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def _full(p: torch.Tensor) -> torch.Tensor:
    """A parameter whole: a shard is all-gathered (a collective: every rank calls it in turn)."""
    return p.full_tensor() if isinstance(p, DTensor) else p


class WeightSync:
    def __init__(self, trainer_model: nn.Module, generator_model: nn.Module, staged: bool = True) -> None:
        src = dict(trainer_model.named_parameters())
        dst = dict(generator_model.named_parameters())
        if src.keys() != dst.keys():
            missing = sorted(src.keys() ^ dst.keys())[:3]
            raise ValueError(f"trainer and generator models differ in parameters: {missing}")
        self.src = [src[n] for n in src]
        self._buffers([dst[n] for n in src], self.src[0].device, staged)

    def _buffers(self, dst: list[torch.Tensor], train_device: torch.device, staged: bool = True) -> None:
        """The generator's tensors, their staging buffers (themselves, unstaged), stream and versions."""
        self.dst = dst
        self.staged = staged
        self.staging = [torch.empty_like(p, device=p.device) for p in self.dst] if staged else list(dst)
        self.gen_device = self.dst[0].device
        if not staged and self.gen_device.type != "cpu":
            raise ValueError("an unstaged weight sync is for a CPU generator: a device copy is asynchronous")
        self.train_device = train_device
        self.copy_stream = _stream(self.gen_device)
        self.sharded = any(isinstance(p, DTensor) for p in self.src)
        self.lock = threading.Lock()
        self.published = 0  # version held in staging
        self.applied = 0  # version in the generator's parameters
        self.released: list[tuple[torch.UntypedStorage, int]] = []  # unstaged: storages freed until publish
        self._staged_event: torch.cuda.Event | None = None
        self._applied_event: torch.cuda.Event | None = None

    @property
    def bytes_per_publish(self) -> int:
        """Bytes one publish moves into staging (and one adoption out of it)."""
        return sum(s.numel() * s.element_size() for s in self.staging)

    def set_version(self, version: int) -> None:
        """Start (or resume) at `version`, with generator and trainer weights already equal."""
        self.published = self.applied = version

    @torch.no_grad()
    def publish(self, version: int) -> None:
        """Trainer side: stage the master weights as `version`. Returns once the copies are enqueued."""
        with self.lock:
            if self.copy_stream is None or (self.sharded and self.train_device.type != "cuda"):
                self._stage_host()  # synchronous copies
            else:
                self._publish_cuda()
            self.published = version

    def _publish_cuda(self) -> None:
        stream = self.copy_stream
        if self.train_device.type == "cuda":
            stream.wait_stream(torch.cuda.current_stream(self.train_device))  # the optimizer step has landed
        if self._applied_event is not None:
            stream.wait_event(self._applied_event)  # the generator has finished reading the last version
        self._stage_cuda(stream)
        event = torch.cuda.Event()
        event.record(stream)
        self._staged_event = event
        if self.train_device.type == "cuda":
            # The next optimizer step must not overwrite master weights the copy is still reading.
            torch.cuda.current_stream(self.train_device).wait_event(event)

    def _stage_host(self) -> None:
        self._reallocate()
        for s, p in zip(self.staging, self.src):
            s.copy_(_full(p))

    def release(self) -> None:
        """Unstaged: free the generator's weights through sync mode's training step, until `publish`
        writes them whole. The storages shrink in place, so every view of them (fused projections,
        tied weights) sees the new weights once `publish` has grown them back."""
        if self.staged or self.released:
            return
        storages = {p.untyped_storage().data_ptr(): p.untyped_storage() for p in self.dst}
        self.released = [(st, st.nbytes()) for st in storages.values() if st.resizable()]
        for st, _ in self.released:
            st.resize_(0)

    @torch.no_grad()
    def restore(self) -> None:
        """The generator's weights back after a `release` no publish followed (a failed step)."""
        if self.released:
            self._stage_host()

    def _reallocate(self) -> None:
        for st, nbytes in self.released:
            st.resize_(nbytes)
        self.released = []

    def _stage_cuda(self, stream: torch.cuda.Stream) -> None:
        if not self.sharded:
            with torch.cuda.stream(stream):
                for s, p in zip(self.staging, self.src):
                    s.copy_(p, non_blocking=True)  # casts fp32 master -> generator dtype on the way
            return
        # Shards: gathered on the trainer's stream, copied once the gather has landed; `_publish_cuda`
        # then makes the trainer's stream wait for the copies before the next optimizer step.
        train_stream = torch.cuda.current_stream(self.train_device)
        for s, p in zip(self.staging, self.src):
            full = _full(p)
            stream.wait_stream(train_stream)
            with torch.cuda.stream(stream):
                s.copy_(full, non_blocking=True)
            full.record_stream(stream)  # its memory is not reused before the copy has read it

    @property
    def pending(self) -> bool:
        return self.published > self.applied

    @torch.no_grad()
    def apply(self, stream: torch.cuda.Stream | None = None) -> tuple[int, torch.cuda.Event | None]:
        """Generator side, between steps: copy staging into the live parameters on `stream` (the
        generator's own). Returns (version now in the parameters, event marking the copy done)."""
        with self.lock:
            if not self.pending:
                return self.applied, None
            done = self._copy_out(stream)
            self.applied = self.published
            return self.applied, done

    def _copy_out(self, stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
        """Staging -> the generator's tensors, in place; on CUDA on `stream`, once staging has landed."""
        if not self.staged:  # publish wrote the live tensors
            return None
        if stream is None or self.gen_device.type != "cuda":
            for d, s in zip(self.dst, self.staging):
                d.copy_(s)
            return None
        stream.wait_event(self._staged_event)
        with torch.cuda.stream(stream):
            for d, s in zip(self.dst, self.staging):
                d.copy_(s, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        self._applied_event = done
        return done


class LoraSync(WeightSync):
    def __init__(self, trainer_model: nn.Module, generator_model: nn.Module) -> None:
        adapted = adapted_modules(trainer_model)
        if not adapted:
            raise ValueError("the trainer's model has no LoRA adapters")
        generator = dict(generator_model.named_modules())
        missing = [name for name, _ in adapted if name not in generator]
        if missing:
            raise ValueError(f"the generator's model has no module {missing[0]} to merge into")
        self.modules = [m for _, m in adapted]
        self.src = []  # nothing is copied as is: every staged tensor is computed by `merged_weight`
        self._buffers([generator[name].weight for name, _ in adapted], adapted[0][1].base_layer.weight.device)

    def set_version(self, version: int) -> None:
        """Start (or resume) at `version`. The generator was loaded with the base weights; the
        merged ones (a resumed adapter's, or the base again when B = 0) are copied in now."""
        with self.lock, torch.no_grad():
            if self.copy_stream is None:
                self._stage_host()
            else:
                self._publish_cuda()
            self._copy_out(torch.cuda.current_stream(self.gen_device) if self.copy_stream is not None else None)
            if self.copy_stream is not None:
                torch.cuda.synchronize(self.gen_device)  # intentional host sync, once, before the engine starts
            self.published = self.applied = version

    def _stage_host(self) -> None:
        for s, module in zip(self.staging, self.modules):
            s.copy_(merged_weight(module, s.dtype))

    def _stage_cuda(self, stream: torch.cuda.Stream) -> None:
        train_stream = torch.cuda.current_stream(self.train_device) if self.train_device.type == "cuda" else None
        for s, module in zip(self.staging, self.modules):
            merged = merged_weight(module, s.dtype)  # on the trainer's stream, one matrix at a time
            if train_stream is not None:
                stream.wait_stream(train_stream)  # this merge has landed before the copy reads it
            with torch.cuda.stream(stream):
                s.copy_(merged, non_blocking=True)
            if merged.is_cuda:
                merged.record_stream(stream)  # its memory is not reused before the copy has read it
