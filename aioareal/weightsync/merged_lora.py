"""Weight sync for LoRA training: the generator runs plain merged weights, never peft.

`WeightSync`'s contract; only what is staged differs: per adapted matrix, `publish` computes
`W + (alpha/r) * B @ A` on the trainer's device (fp32 sum, cast to the generator's dtype). The other
parameters are the base's and never change, so they are never copied. Merging on the trainer's
side keeps peft out of the engine's hot loop (`bench train --lora-rank` prints the bytes moved).
"""
from __future__ import annotations

import torch
from torch import nn

from ..models.lora import adapted_modules, merged_weight
from .full import WeightSync


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
