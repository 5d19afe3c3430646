"""Join the torchrun job for the length of a command, or do nothing without torchrun."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..config import Config
from ..devices import resolve_device
from ..distributed.env import launched_by_torchrun, rank_number
from ..distributed.world import World, current, init, is_collective_failure, rank_error, teardown
from ..errors import RunStopped, UserError


@contextlib.contextmanager
def session(config: Config) -> Iterator[World]:
    """Under torchrun: initialise torch.distributed (NCCL bound to this rank's trainer GPU, or gloo)
    with `dist.timeout_s`, and turn a failed collective into a one-line error naming this rank.
    Without torchrun's variables: this process alone, torch.distributed untouched."""
    if not launched_by_torchrun():
        yield current()
        return
    slot = (rank_number("LOCAL_RANK"), config.rollout.devices_per_rank)
    device = resolve_device(config.rollout.train_device, "train", slot)
    world = init(config.dist.timeout_s, config.dist.backend, device)
    clean = False
    try:
        yield world
        clean = True
    except RunStopped:  # every rank stopped after the same step and checkpointed together
        clean = True
        raise
    except UserError:
        raise
    except Exception as e:
        if is_collective_failure(e):
            raise rank_error(world, e) from e
        raise
    finally:
        teardown(clean)
