"""The package's layers (docs/architecture.md#layers), shared by the architecture test and the
config walk (tests/run/test_config_walk.py)."""
from __future__ import annotations

# Lowest first: a module may import its own layer and the layers below it, never one above. A
# package is named for all its modules; a new package or root module must be placed here.
LAYERS = [
    ["aioareal.errors", "aioareal.io", "aioareal.timing", "aioareal.devices", "aioareal.allocator", "aioareal.losses",
     "aioareal.usercode", "aioareal.loops"],  # usercode: users' reward functions, episodes and tools by import path
    ["aioareal.config"],
    ["aioareal.distributed"],  # primitives only: world, env, reduce, sharding
    ["aioareal.models"],
    ["aioareal.isolation"],  # threads and worker processes for code that may hang: verifiers, reward functions, tools
    ["aioareal.grading"],  # the GSM8K answer reader: the final answer, read as a number, checked
    ["aioareal.tasks", "aioareal.prompt_stream"],
    ["aioareal.rewards"],  # the reward service: a group scored under one deadline, failures counted
    ["aioareal.tools"],  # what episodes call: the calculator, users' tools, timeouts, error observations
    ["aioareal.group"],  # the Group record: an example in, completions, rewards, advantages
    ["aioareal.generation"],
    ["aioareal.episodes"],  # multi-turn episodes: coroutines asking the engine for turns, tools between them
    ["aioareal.checkpoint"],
    ["aioareal.weightsync"],
    ["aioareal.trainer"],
    ["aioareal.orchestrator", "aioareal.evaluation"],  # evaluate: held-out sets on the engine, scored; pass@k, maj@k
    ["aioareal.monitor"],
    ["aioareal.run"],
    ["aioareal.use"],  # after training: the eval and chat commands on runs, checkpoints and models
    ["aioareal.api"],  # the Python API: train, evaluate, Run; the command line trains through it
    ["aioareal.lab", "aioareal.lab.simulate"],
    ["aioareal.lab.bench"],
    ["aioareal.lab.experiments"],
    ["aioareal.cli", "aioareal.__main__", "aioareal"],
]


def is_ancestor(package: str, module: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the longest name that is `module` or a package holding it."""
    best: tuple[int, int] | None = None
    for index, names in enumerate(LAYERS):
        for name in names:
            if is_ancestor(name, module) and (best is None or len(name) > best[1]):
                best = (index, len(name))
    return None if best is None else best[0]
