"""`bench e2e` runs each mode under the threads a run of it takes (devices.with_run_threads): in
sync mode on the CPU the generator and the trainer share one worker thread, in the overlapping
modes each has its own; the caller's width comes back."""
from __future__ import annotations

import threading

import torch

from aioareal.cli import main
from aioareal.orchestrator import workers


def test_sync_shares_one_thread_and_async_keeps_two(capsys, monkeypatch):
    seen: dict[str, set] = {"gen": set(), "train": set()}
    for side, cls, name in (("gen", workers.EngineWorker, "_step"), ("train", workers.TrainerWorker, "_train")):
        original = getattr(cls, name)

        def watched(self, *args, _side=side, _original=original):
            seen[_side].add(threading.current_thread().name)
            return _original(self, *args)
        monkeypatch.setattr(cls, name, watched)
    width = torch.get_num_threads()

    def threads_of(mode: str) -> tuple[set, set]:
        for names in seen.values():
            names.clear()
        assert main(["bench", "e2e", "--modes", mode, "--steps", "1", "--warmup-steps", "1", "--batch-groups",
                     "2", "--group-size", "2", "--prompt-len", "4", "--max-new-tokens", "8", "--mean-len", "4",
                     "--model", "tiny", "--peak-size", "0"]) == 0
        assert torch.get_num_threads() == width
        return set(seen["gen"]), set(seen["train"])

    gen, trained = threads_of("sync")
    assert gen == trained and len(gen) == 1 and next(iter(gen)).startswith("torch")
    gen, trained = threads_of("async")
    assert {n.split("_")[0] for n in gen} == {"generator"} and {n.split("_")[0] for n in trained} == {"trainer"}
