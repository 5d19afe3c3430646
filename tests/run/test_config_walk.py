"""Following a run's config from `setup` through the calls (docs/architecture.md#layers): each layer
hands the layers below it their own section, so the walk never climbs back up a layer.

The walk: every call into aioareal, made while `setup` builds a run, that receives the whole
`Config` or one of its sections; a climb is such a call into a module of a higher layer than its
caller's (a callback carrying config up). Measured on a real run, the default one and one with
episodes in async mode."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from layers import layer_of

import aioareal.config.schema as schema
from aioareal.cli import main
from aioareal.run import recipe

SECTIONS = tuple(v for v in vars(schema).values() if isinstance(v, type) and dataclasses.is_dataclass(v))


def config_walk(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> set[tuple[str, str, str]]:
    """(caller module, callee module, callee function) for each call of `setup`'s walk."""
    edges: set[tuple[str, str, str]] = set()

    def profile(frame, event, _arg):
        if event != "call" or frame.f_back is None:
            return
        callee, caller = frame.f_globals.get("__name__", ""), frame.f_back.f_globals.get("__name__", "")
        code = frame.f_code
        args = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if (callee.startswith("aioareal") and caller.startswith("aioareal")
                and any(isinstance(frame.f_locals.get(a), SECTIONS) for a in args)):
            edges.add((caller, callee, code.co_name))

    setup = recipe.setup

    def traced(*args, **kwargs):
        sys.setprofile(profile)
        try:
            return setup(*args, **kwargs)
        finally:
            sys.setprofile(None)

    monkeypatch.setattr(recipe, "setup", traced)
    assert main(argv) == 0
    return edges


@pytest.mark.slow  # two short runs
@pytest.mark.parametrize("extra", [[], ["--mode", "async", "--max-staleness", "2", "data.episode=calculator",
                                        "tools.names=[calculator]"]], ids=["default", "async-episodes"])
def test_setup_hands_each_layer_its_section_and_never_climbs_back(monkeypatch, tmp_path: Path, tiny_model_path,
                                                                  extra):
    edges = config_walk(monkeypatch, ["--steps", "1", "--no-dashboard", "--run-dir", str(tmp_path / "run"),
                                      "eval.every=0", *extra])
    entered = {callee for _, callee, _ in edges}
    seen = {"aioareal.tasks.base", "aioareal.trainer.trainer", "aioareal.monitor.trackers"}
    assert seen <= entered  # the walk sees them
    climbs = [f"{a} (layer {layer_of(a)}) -> {b}.{f} (layer {layer_of(b)})" for a, b, f in sorted(edges)
              if (layer_of(a) or 0) < (layer_of(b) or 0)]
    assert not climbs, "config climbs back up a layer:\n  " + "\n  ".join(climbs)
