"""The package's layers (docs/architecture.md#layers), shared by the architecture test and the
config walk (tests/run/test_config_walk.py)."""
from __future__ import annotations

# Lowest first: a module may import its own layer and the layers below it, never one above. A
# package is named for all its modules; a new package or root module must be placed here.
LAYERS = [
    # the base: errors, files, clocks, devices, users' code by import path, config, and the one record
    # (Example, Sample, Group) everything else passes around
    ["aioareal.errors", "aioareal.io", "aioareal.timing", "aioareal.devices", "aioareal.allocator", "aioareal.losses",
     "aioareal.usercode", "aioareal.loops", "aioareal.config", "aioareal.group"],
    ["aioareal.distributed", "aioareal.models"],  # the world of ranks; models loaded, converted, encoded
    # what a completion is worth: isolation for code that may hang, the GSM8K grader, tasks and their
    # prompts, the reward service, the tools episodes call
    ["aioareal.isolation", "aioareal.grading", "aioareal.tasks", "aioareal.rewards", "aioareal.tools"],
    ["aioareal.generation", "aioareal.episodes"],  # the engine and the multi-turn episodes that drive it
    ["aioareal.checkpoint", "aioareal.weightsync", "aioareal.trainer"],  # state on disk, weights moved, the update
    # the gate and the loop; held-out sets scored (pass@k, maj@k); what a run shows
    ["aioareal.orchestrator", "aioareal.evaluation", "aioareal.monitor"],
    ["aioareal.run"],  # a run assembled from its config, started, resumed, stopped
    ["aioareal.use", "aioareal.api"],  # after training (eval, chat); the Python API the command line goes through
    # the lab (bench, simulate, experiments) and the command line
    ["aioareal.lab", "aioareal.cli", "aioareal.__main__", "aioareal"],
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
