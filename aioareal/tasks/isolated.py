"""`reward.isolation=process`: the configured reward functions run in the reward worker processes.

The default (`thread`) calls them in the reward service's threads: nothing has to pickle, but a
function that hangs can only be abandoned, and one that holds the GIL stalls the whole process.
With `process`, each group's call is sent to a spawned worker as the function specs, the
completions and the row columns (all of which must pickle); the worker imports the functions once
and keeps them, and the service kills and replaces a worker whose call overruns `reward.timeout_s`.
"""
from __future__ import annotations

from typing import Any

from ..group import Example
from ..isolation.pool import Deferred
from .reward_functions import RewardFunctionError, WeightedRewards, batch_columns, check_failure, load_reward_functions

_loaded: dict[tuple[tuple[str, ...], tuple[float, ...]], WeightedRewards] = {}


class ProcessRewards:
    """A scorer that hands the whole group to a worker process (one Deferred per call)."""

    worker_preload: tuple[str, ...] = (__name__,)

    def __init__(self, specs: list[str], weights: list[float] | None = None) -> None:
        self.specs, self.weights = tuple(specs), tuple(weights or ())

    takes_completion_ids = True  # the reward service passes the completions' token ids (rewards/service.py)

    def __call__(self, texts: list[str], examples: list[Example],
                 completion_ids: list[list[int]] | None = None) -> Deferred:
        columns = batch_columns(examples, completion_ids)
        return Deferred(f"{__name__}:score_in_worker", (self.specs, self.weights, list(texts), columns))


def score_in_worker(specs: tuple[str, ...], weights: tuple[float, ...], texts: list[str],
                    columns: dict[str, list[Any]]) -> list[float]:
    """Runs in a worker: the weighted reward of each completion (functions loaded once per worker)."""
    rewards = _loaded.get((specs, weights))
    if rewards is None:
        rewards = _loaded[(specs, weights)] = WeightedRewards(load_reward_functions(list(specs)), list(weights))
    return rewards.with_columns(texts, columns)


def check_in_worker(spec: str, completions: list[Any], columns: dict[str, list[Any]]) -> list[float | None]:
    """Runs in a worker: `WeightedRewards.check` of one function under reward.isolation=process. A failure
    comes back as one RewardFunctionError line, saying where in the user's code it went wrong."""
    fn = load_reward_functions([spec])[0]
    try:
        return fn(completions, columns)
    except RewardFunctionError:
        raise
    except Exception as e:
        raise RewardFunctionError(check_failure(spec, e, len(completions))) from None
