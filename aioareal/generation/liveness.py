"""Which slots are still generating, decided on the device from the tokens it just sampled.

The host's bookkeeping decides when a sequence ends (an EOS token where it stops on EOS, else its
length limit) and records why. The device applies the same rule to clear `live` itself, so the
next decode step can be launched before the host has read a single token (the engine's overlap,
engine.py): each slot's remaining length and whether it stops on EOS go up once, at admission,
with the prompt's other metadata; the EOS ids go up once, when the engine is built.

The rule is kept in one place, `ended`, and it must agree with the host's `Engine._append`
(tests/generation/test_engine_overlap.py checks that the device's `live` equals the host's running set after
every step of a plain engine).
"""
from __future__ import annotations

import torch

from .upload import upload


class SlotLimits:
    """Per-slot length budget and EOS flag on the device: remaining (slots,) int64, tokens a slot
    may still sample; stop_on_eos (slots,) bool."""

    def __init__(self, num_slots: int, eos_ids: list[int], device: torch.device) -> None:
        self.remaining = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.stop_on_eos = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.eos = upload(sorted(set(eos_ids)), device)  # (E,), maybe empty: nothing ends on EOS

    def ended(self, tokens: torch.Tensor, remaining: torch.Tensor, stop_on_eos: torch.Tensor) -> torch.Tensor:
        """tokens (n,) just sampled, remaining (n,) after them -> (n,) bool: the sequence is over.
        A comparison against every EOS id rather than `torch.isin`, whose sort-based path is not
        something a CUDA graph should have to capture; E is a handful of ids."""
        is_eos = (tokens[:, None] == self.eos[None, :]).any(dim=-1)
        return (remaining <= 0) | (stop_on_eos & is_eos)

    def start(self, slots: torch.Tensor, first: torch.Tensor, limits: torch.Tensor,
              stop_on_eos: torch.Tensor) -> torch.Tensor:
        """Admission: slots (m,) take their limits and EOS flags; returns their liveness (m,) after
        the first tokens `first` (m,) sampled from the prefill."""
        remaining = limits - 1
        self.remaining[slots] = remaining
        self.stop_on_eos[slots] = stop_on_eos
        return ~self.ended(first, remaining, stop_on_eos)

    def advance(self, live: torch.Tensor, tokens: torch.Tensor, index: slice | torch.Tensor) -> None:
        """A decode step sampled `tokens` for the slots `index` (a slice or an index tensor); clear
        `live` (the engine's (slots,) tensor, updated in place) where they ended. Finished slots'
        budgets keep counting down: nothing reads them until admission resets them."""
        remaining = self.remaining[index] - 1
        self.remaining[index] = remaining
        live[index] = live[index] & ~self.ended(tokens, remaining, self.stop_on_eos[index])
