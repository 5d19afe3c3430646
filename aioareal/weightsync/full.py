"""Weight sync from the trainer's master weights to the generator's copy (docs/architecture.md rule 5).

`publish` (trainer thread) copies every parameter into a staging buffer on the generator's device
with non-blocking copies on a dedicated stream, records an event and bumps the version. `apply`
(generator thread, between two engine steps) makes the generator's stream wait on that event and
copies staging into the live parameters in place (`param.copy_`, never rebinding: CUDA graphs hold
raw pointers). Neither side waits on the host.

Why a staging buffer: the trainer must never wait for the generator to reach a step boundary (in
one-step mode that is a whole batch away), and the generator must never see half a model. Staging
gives both: a version is all parameters or none, and each side moves at its own pace. The cost is
one extra copy of the generator's weights in its dtype, and a same-device copy when adopting.

Unstaged (`staged=False`): where the two sides run on one thread and in sync mode (run/build.py),
the generator is idle with nothing in flight whenever the trainer publishes, and it adopts before
its next step, so `publish` writes the live parameters directly and `apply` only moves the
version. The staging copy (0.27 GB for a 135M bf16 generator) then never exists: it would be
resident through every training step's peak (docs/log/2026-11-memory-4gib.md).

On the CPU the copies are synchronous and streams are no-ops; a lock orders the two threads.

Under torchrun the trainer's parameters are FSDP2 shards (DTensors): `publish` gathers each one
whole (`full_tensor`, an all-gather on the trainer's stream, every rank in the same order) just
before its copy, so the gather never holds more than one full parameter beyond the staging buffer.
"""
from __future__ import annotations

import threading

import torch
from torch import nn
from torch.distributed.tensor import DTensor


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
        """The generator's tensors to write, one staging buffer each (or the tensors themselves,
        unstaged), the stream and the versions."""
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
        """Unstaged: free the generator's weights until the next `publish` writes them whole (sync
        mode's training step, which they would otherwise sit through: 0.27 GB of SmolLM2 in bf16).
        The storages shrink to nothing in place, so every view of them (the engine's fused
        projections, tied weights) sees the new weights once `publish` has grown them back."""
        if self.staged or self.released:
            return
        storages = {p.untyped_storage().data_ptr(): p.untyped_storage() for p in self.dst}
        self.released = [(st, st.nbytes()) for st in storages.values() if st.resizable()]
        for st, _ in self.released:
            st.resize_(0)

    @torch.no_grad()
    def restore(self) -> None:
        """The generator's weights back, equal to the trainer's masters, after a `release` that no
        publish followed (a training step that failed); a no-op otherwise."""
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
        # Shards: gather each parameter on the trainer's stream, then copy it on the copy stream once
        # the gather has landed; `_publish_cuda` then makes the trainer's stream wait for the copies,
        # so the next optimizer step cannot change a shard while a copy still reads what it gathered.
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
