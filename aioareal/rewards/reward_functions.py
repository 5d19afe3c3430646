"""Reward functions by import path, in TRL's convention, unchanged.

`reward.functions=[mypkg.rewards:exact, ./my_rewards.py:brevity]` names functions with TRL's
GRPOTrainer signature, `fn(completions, **kwargs) -> list[float]`, called on a batch (one prompt's
group): `completions` are the decoded completions (strings), `prompts` the examples' prompts, and
every other column of the dataset rows comes as a list aligned with `completions`, so
`def exact(completions, answer, **kwargs)` works as written for TRL. A function without `**kwargs`
gets only the columns it names. `async def` functions are run to completion (loops.run_coroutine) in
the reward service's worker thread (a fresh event loop per call), under the service's timeout;
with `reward.isolation=process` the same happens in a worker process (`score_in_worker`).

The reward is the weighted sum over functions (`reward.weights`, default 1 each). As in TRL, an
entry of None (or NaN) means "does not apply to this sample" and adds nothing. A function that
raises or returns the wrong length or a non-number fails its batch (the reward service scores it 0
and counts it); `check` calls every function once on training rows before training starts, so a
wrong signature or return value is a one-line error instead.

Held-out completions go through a reward service of their own (evaluation/scored_completions.py),
as training's do. Outside any service (`check`, and `RewardedTask.score` in episodes' held-out
evaluation) the functions are called through an `isolation.threads.GuardedCaller`: the reward
service's timeout and isolation (threads, or worker processes with `reward.isolation=process`), never
in-process without a deadline. A function that hangs in the check is a one-line error naming it and
the timeout; in evaluation it scores 0 and is counted (`eval_reward_failures`).
"""
import copy
import inspect
import math
import numbers
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from statistics import fmean, pstdev
from typing import Any

from ..config import ArithmeticConfig, DataConfig, RewardConfig
from ..errors import UserError
from ..group import Example
from ..isolation.pool import Deferred, Outcome
from ..isolation.threads import GuardedCaller
from ..loops import run_coroutine
from ..tasks.base import Task, base_task
from ..usercode import first_line as _first_line
from ..usercode import is_registered, resolve_spec
from ..usercode import user_frame as _user_frame
from .service import BatchScorer, GradedScorer, per_item

TRL_SIGNATURE = "fn(completions, **kwargs) -> list[float]"
RESERVED = ("prompt", "prompts", "completion", "completions", "completion_ids")  # not passed as columns
_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
ISOLATED = __name__  # where worker processes call them: this module, imported there by name


class RewardFunctionError(UserError):
    """A reward function cannot be loaded, cannot be called, or returned something unusable."""


@dataclass(frozen=True)
class RewardFunction:
    spec: str  # as configured: 'pkg.mod:fn' or 'path/to/file.py:fn'
    fn: Callable[..., Any]
    accepts: frozenset[str] | None  # keyword arguments it takes; None: any (it has **kwargs)
    required: frozenset[str]  # arguments without defaults, besides completions

    @property
    def name(self) -> str:  # as TRL logs it: the function's __name__ (a lambda from Python: its registered name)
        if is_registered(self.spec):
            return self.spec.rsplit(":", 1)[-1]
        return getattr(self.fn, "__name__", self.spec.rsplit(":", 1)[-1])

    def __call__(self, completions: list[Any], columns: dict[str, list[Any]]) -> list[float | None]:
        kwargs = columns if self.accepts is None else {k: v for k, v in columns.items() if k in self.accepts}
        missing = sorted(self.required - kwargs.keys())
        if missing:
            raise RewardFunctionError(
                f"reward function '{self.spec}' needs argument(s) {', '.join(map(repr, missing))}, which the "
                f"rows lack (it can take: completions, {', '.join(columns)})")
        # Copies: a function that edits its arguments in place (answer.pop(), a list column sorted)
        # must not change the data set that every later call, and the held-out scoring, reads.
        result = self.fn(completions=list(completions), **copy.deepcopy(kwargs))
        if inspect.isawaitable(result):
            result = run_coroutine(_awaited(result))  # a fresh loop (beside one if this thread runs one)
        return self._values(result, len(completions))

    def _values(self, result: Any, n: int) -> list[float | None]:
        if hasattr(result, "tolist"):  # numpy array or torch tensor
            result = result.tolist()
        if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__len__"):
            raise RewardFunctionError(f"reward function '{self.spec}' returned {type(result).__name__}, expected "
                                      f"a list of {n} numbers (one per completion)")
        if len(result) != n:
            raise RewardFunctionError(f"reward function '{self.spec}' returned {len(result)} values for {n} "
                                      f"completions (expected one per completion)")
        return [self._number(x, i) for i, x in enumerate(result)]

    def _number(self, x: Any, i: int) -> float | None:
        if x is None:
            return None
        if hasattr(x, "item") and not isinstance(x, numbers.Real):  # a numpy or torch scalar (numpy.bool_)
            x = x.item()
        try:
            value = float(x) if isinstance(x, numbers.Real) else math.inf
        except OverflowError:  # an int past float's range (10**400)
            value = math.inf
        if math.isinf(value):
            shown = f"an int too large for a float ({x.bit_length()} bits)" if isinstance(x, int) else repr(x)[:80]
            raise RewardFunctionError(f"reward function '{self.spec}' returned {shown} at index {i}, expected a "
                                      f"finite number (or None: does not apply)")
        return None if math.isnan(value) else value


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def batch_columns(examples: list[Example], completion_ids: list[list[int]] | None = None) -> dict[str, list[Any]]:
    """TRL's reward kwargs: each row column as a list aligned with the completions, plus `prompts`
    (message lists for conversational rows, as TRL passes them) and `completion_ids` when known."""
    keys = [k for k in dict.fromkeys(k for e in examples for k in e.row) if k not in RESERVED]
    columns = {k: [e.row.get(k) for e in examples] for k in keys}
    if "answer" not in columns and any(e.answer for e in examples):
        columns["answer"] = [e.answer for e in examples]  # a task whose rows carry no answer column
    columns["prompts"] = [e.prompt if e.messages is None else [dict(m) for m in e.messages] for e in examples]
    if completion_ids is not None:
        columns["completion_ids"] = [list(ids) for ids in completion_ids]
    return columns


def as_completions(texts: list[str], columns: dict[str, list[Any]]) -> list[Any]:
    """What TRL passes as `completions`: strings, or for conversational prompts one assistant message each."""
    prompts = columns.get("prompts") or []
    if prompts and isinstance(prompts[0], list):
        return [[{"role": "assistant", "content": t}] for t in texts]
    return list(texts)


class WeightedRewards:
    """A `BatchScorer` (rewards.RewardService's input): the weighted sum of reward functions."""

    takes_completion_ids = True  # the reward service passes the completions' token ids (rewards/service.py)

    def __init__(self, functions: list[RewardFunction], weights: list[float] | None = None,
                 tally: bool = True) -> None:
        weights = list(weights) if weights else [1.0] * len(functions)
        if len(weights) != len(functions):
            raise UserError(f"reward.weights has {len(weights)} entries for {len(functions)} reward.functions")
        self.functions, self.weights = functions, weights
        self.tally = tally  # False for held-out scoring: its values stay out of training's reward/<name> figures
        self._values: dict[str, list[float]] = {fn.name: [] for fn in functions}  # since the last metrics()
        self._values_lock = threading.Lock()

    def __call__(self, texts: list[str], examples: list[Example],
                 completion_ids: list[list[int]] | None = None) -> list[float]:
        return self.with_columns(texts, batch_columns(examples, completion_ids), tally=self.tally)

    def with_columns(self, texts: list[str], columns: dict[str, list[Any]], tally: bool = False) -> list[float]:
        totals = [0.0] * len(texts)
        completions = as_completions(texts, columns)
        for fn, weight in zip(self.functions, self.weights):
            values = fn(completions, columns)
            for i, value in enumerate(values):
                if value is not None:
                    totals[i] += weight * value
            if tally:
                with self._values_lock:
                    self._values[fn.name] += [v for v in values if v is not None]
        return totals

    def metrics(self) -> dict[str, float]:
        """Each function's mean and std over the completions it scored since the last call (a metrics
        row), as `reward/<name>/mean` and `reward/<name>/std`; a function that scored none is left out."""
        with self._values_lock:
            drained, self._values = self._values, {name: [] for name in self._values}
        row = {}
        for name, values in drained.items():
            if values:
                row[f"reward/{name}/mean"], row[f"reward/{name}/std"] = fmean(values), pstdev(values)
        return row

    def check(self, examples: list[Example], caller: GuardedCaller | None = None, isolation: str = "thread") -> None:
        """Call every function once on the first two rows (their answers as completions), under `caller`'s
        timeout and in `isolation`'s place: a wrong signature, return length or type, or a function that
        does not return in time, is a one-line error before any model loads."""
        caller = caller or GuardedCaller(DEFAULT_TIMEOUT_S)
        sample = examples[:2]
        texts = [e.answer for e in sample]
        # Stand-in token ids (the answers' bytes) for the dry run: a length reward can be called.
        columns = batch_columns(sample, [list(t.encode()) for t in texts])
        completions = as_completions(texts, columns)
        for fn in self.functions:
            if isolation == "process":
                call = Deferred(f"{ISOLATED}:check_in_worker", (fn.spec, completions, columns))
                outcome = caller.call(call, (ISOLATED,))
            else:
                outcome = caller.call(lambda fn=fn: fn(completions, columns))
            if not outcome.ok:
                raise RewardFunctionError(check_failure(fn.spec, outcome, len(sample), caller.timeout_s))

    def specs(self) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """What a worker process needs to load these functions (`score_in_worker`)."""
        return tuple(f.spec for f in self.functions), tuple(self.weights)


DEFAULT_TIMEOUT_S = 10.0  # reward.timeout_s's default, for callers built without a config


def check_failure(spec: str, failed: Outcome | Exception, rows: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """The one line that says why reward function `spec` failed the check on the first `rows` rows."""
    where = f"when called on the first {rows} training rows (their answers as completions)"
    if isinstance(failed, Outcome) and failed.status == "timeout":
        return (f"reward function '{spec}' did not return within reward.timeout_s={timeout_s}s {where}: it hangs, "
                f"or needs a longer reward.timeout_s")
    error = failed.value if isinstance(failed, Outcome) else failed
    if isinstance(error, RewardFunctionError):
        return str(error)
    if isinstance(error, Exception):
        raised = f"{type(error).__name__}: {_first_line(error)}{_user_frame(error)}"
        return f"reward function '{spec}' raised {raised} {where}"
    message = failed.message.removeprefix("RewardFunctionError: ")  # a worker's report, already one line
    if message.startswith("reward function"):
        return message
    return f"reward function '{spec}' failed: {message} {where}"


class RewardedTask:
    """A task whose completions the configured reward functions score, in training and in evaluation.

    Evaluation averages `score` over the held-out set, so `eval_pass_rate` is the mean held-out
    reward of greedy completions: the pass rate when the reward is 0/1. `score` calls the functions
    through `caller` (the reward service's timeout and isolation): one that raises, runs past the
    timeout or returns garbage scores that completion 0, counted in `failures` (timeouts also in
    `timeouts`), as in training.
    """

    def __init__(self, task: Task, rewards: WeightedRewards, caller: GuardedCaller | None = None,
                 isolation: str = "thread") -> None:
        self.task, self.rewards, self.isolation = task, rewards, isolation
        self.caller = caller or GuardedCaller(DEFAULT_TIMEOUT_S)
        self.name, self.chat = task.name, task.chat
        self.failures = self.timeouts = 0
        self.encode: Callable[[str], list[int]] | None = None  # the tokenizer's, set once one is loaded
        self._lock = threading.Lock()
        self._checked = False

    def splits(self) -> tuple[list[Example], list[Example]]:
        train, held_out = self.task.splits()
        if not self._checked:
            self.rewards.check(train or held_out, self.caller, self.isolation)
            self._checked = True
        return train, held_out

    def score(self, completion: str, example: Example) -> float:
        # completion_ids re-encoded from the text (when `encode` is set); not tallied in the training metrics
        ids = [self.encode(completion)] if self.encode is not None else None
        columns = batch_columns([example], ids)
        if self.isolation == "process":
            specs, weights = self.rewards.specs()
            outcome = self.caller.call(Deferred(f"{ISOLATED}:score_in_worker", (specs, weights, [completion], columns)),
                                       (ISOLATED,))
        else:
            outcome = self.caller.call(lambda: self.rewards.with_columns([completion], columns))
        value = outcome.value[0] if outcome.ok and isinstance(outcome.value, list) and outcome.value else None
        if isinstance(value, float) and math.isfinite(value):
            return value
        with self._lock:
            self.failures += 1
            self.timeouts += outcome.status == "timeout"
        return 0.0

    def __getattr__(self, name: str) -> Any:  # the wrapped task's extras (skipped, source, ...)
        if name == "task":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.task, name)


def load_reward_functions(specs: list[str]) -> list[RewardFunction]:
    """Resolve 'pkg.mod:fn' / 'path/to/file.py:fn' specs and check they take TRL's arguments."""
    return [_checked(spec, resolve(spec)) for spec in specs]


def resolve(spec: str) -> Any:
    return resolve_spec(spec, "reward function", RewardFunctionError)


def _checked(spec: str, fn: Any) -> RewardFunction:
    if not callable(fn):
        raise RewardFunctionError(f"reward function '{spec}' names a {type(fn).__name__} object, not a function "
                                  f"({TRL_SIGNATURE})")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return RewardFunction(spec, fn, None, frozenset())
    params = list(sig.parameters.values())
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    names = {p.name for p in params if p.kind in _KEYWORD}
    positional_only = [p.name for p in params
                       if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty]
    if positional_only or ("completions" not in names and not var_kw):
        raise RewardFunctionError(f"reward function '{spec}' has signature {sig}, which cannot take TRL's "
                                  f"keyword arguments: expected {TRL_SIGNATURE}")
    required = {p.name for p in params if p.kind in _KEYWORD and p.default is p.empty} - {"completions"}
    return RewardFunction(spec, fn, None if var_kw else frozenset(names), frozenset(required))


# `reward.isolation=process`: the configured reward functions run in the reward worker processes.
#
# The default (`thread`) calls them in the reward service's threads: nothing has to pickle, but a
# function that hangs can only be abandoned, and one that holds the GIL stalls the whole process.
# With `process`, each group's call is sent to a spawned worker as the function specs, the
# completions and the row columns (all of which must pickle); the worker imports the functions once
# and keeps them, and the service kills and replaces a worker whose call overruns `reward.timeout_s`.
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


def build_task(data: DataConfig, arithmetic: ArithmeticConfig, reward: RewardConfig, group_size: int) -> Task:
    """The task data.task names; `group_size` (algo.group_size) shares reward.timeout_s among a group's
    completions for the checks outside the reward service (`_item_timeout`)."""
    task = base_task(data, arithmetic, _item_timeout(reward, group_size), bool(reward.functions))
    if not reward.functions:
        return task
    r = reward
    rewards = WeightedRewards(load_reward_functions(r.functions), r.weights)
    # The check before training and evaluation call the functions under training's timeout and isolation.
    return RewardedTask(task, rewards, GuardedCaller(r.timeout_s, r.workers, r.memory_limit_mb), r.isolation)


def build_scorer(reward: RewardConfig, task: Task, tally: bool = True) -> BatchScorer:
    """The reward service's scorer: the configured reward functions in batch form, else the task's verdict.
    `tally`: the functions' values go into the metrics' reward/<name> figures (training's, not held-out's)."""
    r = reward
    if r.functions and r.isolation == "process":
        return ProcessRewards(r.functions, r.weights)
    if isinstance(task, RewardedTask):
        return task.rewards if tally else WeightedRewards(task.rewards.functions, task.rewards.weights, tally=False)
    if r.functions:  # a task built by hand rather than by build_task
        return WeightedRewards(load_reward_functions(r.functions), r.weights, tally)
    grade = getattr(task, "grade", None)
    if grade is not None:
        from ..grading.verify import SYMBOLIC_PRELOAD

        return GradedScorer(grade, (SYMBOLIC_PRELOAD,))
    return per_item(task.score)


def _item_timeout(reward: RewardConfig, group_size: int) -> float:
    """The standalone checks' timeout (`task.score`, which episodes' evaluation calls outside the
    reward service): a share of reward.timeout_s per completion, at least a second unless the whole timeout
    is shorter. Training rewards need none: the service's deadline covers the whole group."""
    share = reward.timeout_s / group_size
    return min(reward.timeout_s, max(share, 1.0))
