"""Command line: `python -m aioareal [flags] [section.key=value ...]` trains; subcommands do the rest.

Every user error (bad config key, missing file, malformed data) is printed as one line on stderr
with exit code 2; `--debug` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .distributed.env import launched_by_torchrun
from .errors import guarded, one_line

if TYPE_CHECKING:  # the config loads lazily: --help and --version import no torch
    from .config import Config


def train_parser(prog: str = "python -m aioareal") -> argparse.ArgumentParser:
    epilog = ("Any config key can be set as section.key=value, e.g. algo.lr=1e-5 or reward.weights=[1,0.1]. "
              "List them with: python -m aioareal config --keys")
    if prog == "python -m aioareal":  # the top level: name the subcommands too
        epilog = f"{commands_help()}\n\n{epilog}\n`python -m aioareal COMMAND --help` shows a command's own flags."
    p = argparse.ArgumentParser(prog=prog, description="Train a language model with GRPO/PPO, sync or async.",
                                epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=version())
    p.add_argument("--config", help="YAML config file (see configs/)")
    p.add_argument("--mode", choices=["sync", "one-step", "async"], help="rollout mode")
    p.add_argument("--max-staleness", type=int, help="K: max policy lag of a trained sample")
    p.add_argument("--objective", choices=["ppo", "decoupled", "dg"], help="policy objective")
    p.add_argument("--steps", type=int, help="training steps")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--run-dir", help="output directory (default runs/<mode>-<objective>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its latest checkpoint; "
                   "'auto' continues --run-dir if it holds a run and starts it otherwise (torchrun --max-restarts)")
    p.add_argument("--force", action="store_true", help="with --resume: accept a changed config")
    p.add_argument("--no-dashboard", action="store_true", help="one plain line per step instead of the dashboard")
    p.add_argument("--debug", action="store_true", help="show tracebacks for user errors")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    return p


def flags_of(args: argparse.Namespace) -> dict[str, object]:
    return {"rollout.mode": args.mode, "rollout.max_staleness": args.max_staleness,
            "algo.objective": args.objective, "train.steps": args.steps, "run.seed": args.seed,
            "run.run_dir": args.run_dir, "run.dashboard": "off" if args.no_dashboard else None}


def load(args: argparse.Namespace):
    from .config import load_config

    return load_config(args.config, args.overrides, flags_of(args))


def cmd_train(argv: list[str], restart: bool = False) -> int:
    args = train_parser().parse_intermixed_args(argv)
    return guarded(args.debug, lambda: _train(args, restart))


def _train(args: argparse.Namespace, restart: bool = False) -> int:
    """Train or resume; under torchrun inside the job's session (one cell per rank, README "Scaling out").
    `restart`: this is `python -m aioareal` itself, which may start again with run.allocator's
    malloc (allocator.py) once the config is known and before any model loads."""
    # A fresh run's config is read first: a bad flag or file fails in a second, before torch loads.
    fresh = load(args) if args.resume is None else None
    if fresh is not None:
        from .run.early_checks import check_before_loading

        check_before_loading(fresh)
    from .api.training import run_training
    from .checkpoint.resume_plan import check_unchanged, resume_config, resume_target

    target = resume_target(args.resume, args.run_dir, args.config)
    flags = {k: v for k, v in flags_of(args).items() if k != "run.run_dir"}
    config = resume_config(target, args.overrides, flags, args.force) if target else fresh or load(args)
    if restart:
        from .allocator import cap_onednn_cache, note, reexec

        cap_onednn_cache(os.environ)  # before any matmul; the restart inherits it
        reexec(config.run.allocator)  # returns in the process that trains
        if os.environ.get("RANK", "0") == "0":
            print(note(config.run.allocator))
            bf16_note(config)
    if not target:
        profile_note(args)
    if target and args.config:  # --resume auto with the config the run was started from
        check_unchanged(config, load(args), args.force)
    run_training(config, target, flags, args.force, overrides=args.overrides)
    return 0


def bf16_note(config: Config) -> None:
    """Warn, once, where bf16 is asked of a CPU that only emulates it."""
    from .devices import cpu_flags, emulated_bf16

    r, m = config.rollout, config.model
    on_cpu = {key: dtype for key, dtype, device in (("model.dtype", m.dtype, r.gen_device),
                                                     ("model.train_dtype", m.train_dtype, r.train_device))
              if device == "cpu" or (device == "auto" and not _has_cuda())}
    note = emulated_bf16(on_cpu, cpu_flags())
    if note:
        print(note, flush=True)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def profile_note(args: argparse.Namespace) -> None:
    """Say which defaults a pretrained model got: the `pretrained` profile without a config file
    (config/layering.py), or, with a file, the tiny model's defaults for the keys it leaves out."""
    from .config.layering import is_pretrained, load_with_sources

    config, sources = load_with_sources(args.config, args.overrides, flags_of(args))
    if not is_pretrained(config.model.name):
        return
    start = "configs/smollm2-sums.yaml" if config.data.task == "arithmetic" else "configs/qwen2.5-0.5b-gsm8k.yaml"
    shown = ("algo.lr", "generation.max_new_tokens", "train.steps")
    taken = [k for k, source in sources.items() if source.startswith("profile")]
    if taken:  # on stdout, beside the resolved config the run prints: a note, not an error
        values = ", ".join(f"{k}={_value(config, k)}" for k in shown if k in taken)
        print(f"model.name={config.model.name} without --config: {len(taken)} defaults from the 'pretrained' "
              f"profile ({values + '; ' if values else ''}all: python -m aioareal config --sources); a full config "
              f"to start from: {start}")
    elif args.config and sources["model.name"] in ("flag", "key=value"):
        kept = [f"{k}={_value(config, k)}" for k in shown if sources[k] == "default"]
        if kept:
            print(f"model.name={config.model.name} with {args.config}: the keys it leaves out keep the tiny model's "
                  f"defaults ({', '.join(kept)}); for a pretrained model start from {start}")


def _value(config: Any, dotted: str) -> str:
    section, _, key = dotted.partition(".")
    value = getattr(getattr(config, section), key)
    return f"{value:g}" if isinstance(value, float) else str(value)


def cmd_warmup(argv: list[str]) -> int:
    args = train_parser("python -m aioareal warmup").parse_intermixed_args(argv)

    def go() -> int:
        from .run.warmup import ensure_tiny

        print(ensure_tiny(load(args)))
        return 0
    return guarded(args.debug, go)


def cmd_config(argv: list[str]) -> int:
    parser = train_parser("python -m aioareal config")
    parser.add_argument("--keys", nargs="?", const="", metavar="SECTION",
                        help="list every config key (of SECTION only, if given) with its help text")
    parser.add_argument("--sources", action="store_true",
                        help="each resolved value with where it came from: default, profile, file, flag, key=value")
    args = parser.parse_intermixed_args(argv)

    def go() -> int:
        from .config import dump_yaml

        if args.keys is not None:
            print_keys(args.keys)
        elif args.sources:
            print_sources(args)
        else:
            print(dump_yaml(load(args)), end="")
        return 0
    return guarded(args.debug, go)


def print_sources(args: argparse.Namespace) -> None:
    from .config.layering import load_with_sources, to_dict

    config, sources = load_with_sources(args.config, args.overrides, flags_of(args))
    values = to_dict(config)
    width = 48  # most lines align; a long list value pushes its own comment right
    for key, source in sources.items():
        section, name = key.split(".")
        print(f"{f'{key} = {values[section][name]!r}':<{width}}  # {source}")


def print_keys(section: str = "") -> None:
    import dataclasses

    from .config.layering import section_types
    from .errors import UserError

    sections = section_types()
    if section and section not in sections:
        raise UserError(f"config --keys {section}: unknown section (expected one of {', '.join(sections)})")
    for name, cls in sections.items():
        if section and name != section:
            continue
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            print(f"{name}.{f.name} = {default!r}  # {f.metadata.get('help', '')}")


# One line per subcommand for `--help` and for an unknown command's error; a command missing here
# still appears (with its name only), so `--help` lists whatever `commands()` holds.
SUMMARIES = {"train": "train (the default: `python -m aioareal [flags] [key=value ...]`)",
             "warmup": "train the tiny model's supervised warm-start only",
             "sft": "supervised fine-tuning on demonstrations, the stage before RL",
             "config": "print the resolved config (--keys [SECTION]: every key; --sources: where each came from)",
             "bench": "benchmarks (generation, training, rewards, ...)",
             "simulate": "model a run on GPUs this machine does not have",
             "sweep": "run a grid of runs", "plot": "plot a sweep", "report": "write a sweep's report.md",
             "samples": "show a run's completions", "eval": "score checkpoints or models on a test set",
             "chat": "talk to a trained policy", "export": "write a policy as GGUF (llama.cpp, Ollama) or to the Hub"}


def commands() -> dict[str, Callable[[list[str]], int]]:
    """Every subcommand by name; each imports its module on use (training needs neither pandas,
    matplotlib nor the benchmarks)."""
    def lazy(module: str, name: str) -> Callable[[list[str]], int]:
        def run(a: list[str]) -> int:
            import importlib

            return getattr(importlib.import_module(module, __package__), name)(a)
        return run
    return {"train": cmd_train, "warmup": cmd_warmup, "sft": lazy(".run.sft", "main"), "config": cmd_config,
            "plot": lazy(".lab.experiments.commands", "cmd_plot"),
            "report": lazy(".lab.experiments.commands", "cmd_report"),
            "sweep": lazy(".lab.experiments.commands", "cmd_sweep"), "bench": lazy(".lab.bench", "main"),
            "simulate": lazy(".lab.simulate.command", "main"), "samples": lazy(".use.samples", "main"),
            "eval": lazy(".use.eval_command", "main"), "chat": lazy(".use.chat", "main"),
            "export": lazy(".use.export", "main")}


def commands_help() -> str:
    names = commands()
    width = max(map(len, names))
    return "commands:\n" + "\n".join(f"  {n:<{width}}  {SUMMARIES.get(n, '')}".rstrip() for n in names)


def unknown_command(word: str) -> str | None:
    """The error for a first word that is neither a command, a flag nor section.key=value."""
    if word in commands() or word.startswith("-") or "=" in word:
        return None
    return f"error: unknown command '{word}' (commands: {', '.join(commands())})"


def version() -> str:
    from importlib import metadata

    from . import __version__

    try:
        return f"aioareal {metadata.version('aioareal')}"
    except metadata.PackageNotFoundError:  # run from a checkout without installing it
        return f"aioareal {__version__}"


def main(argv: list[str] | None = None, restart: bool = False) -> int:
    """`restart`: called as `python -m aioareal`, which may start itself again (allocator.py)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    table = commands()
    if argv[:1] == ["--version"]:
        print(version())
        return 0
    error = unknown_command(argv[0]) if argv else None
    if error:
        print(one_line(error), file=sys.stderr)  # it quotes the word as typed
        return 2
    if argv and argv[0] in table and argv[0] != "train" and launched_by_torchrun():
        print(one_line(f"error: '{argv[0]}' runs in one process; under torchrun only training runs (one cell per "
                       "rank)"), file=sys.stderr)
        return 2
    try:
        if argv and argv[0] in table:
            return table[argv[0]](argv[1:]) if argv[0] != "train" else cmd_train(argv[1:], restart)
        return cmd_train(argv, restart)
    except BrokenPipeError:  # `python -m aioareal ... | head`: the reader left, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
