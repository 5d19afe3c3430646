"""Property-based fuzzing of the newer commands' arguments (issue 49, item 9): eval, chat, export,
sweep, report, plot and samples, given hostile numbers (negative, huge, NaN, infinite, 1e-300),
paths (missing, a file where a directory belongs, a directory where a file belongs, an empty one)
and malformed values. Whatever the arguments, the outcome is the command's work, argparse's usage
and its one error line (exit 2), or exactly one line 'error: ...' with exit 2: never a traceback.

The work itself is cut short where it would load a model, train or draw (each stands in for what
test_fuzz_inputs.py and the commands' own tests cover): a stub records what the command was about
to do, so that a value the command let through can be checked against its range."""
from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from error_helpers import assert_clean
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from aioareal.cli import main
from aioareal.config.limits import INT_MAX

FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Reached(Exception):  # noqa: N818 - not an error: the command got past its checks to the work
    def __init__(self, **seen: Any) -> None:
        super().__init__("reached the work")
        self.seen = seen


def reached(**names: str):
    """A stub for a function of the work: raises Reached with the named arguments it was given."""
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise Reached(**{name: (args[i] if isinstance(i, int) and i < len(args) else kwargs.get(name))
                         for name, i in names.items()})
    return stub


numbers = st.sampled_from(["-1", "0", "1", "2", "0.5", "1e-300", "nan", "inf", "-inf", "1e400", "-0",
                           "99999999999999999999999", "2147483648", "0x10", "1_000", " 3", ""]) \
    | st.integers(-10**25, 10**25).map(str) | st.floats().map(repr)
words = st.sampled_from(["", " ", "\x1b[2J", "\u202e", "a/b", "..", "-", "--", "=", "x=y", "{}", "%s", "\x00"]) \
    | st.text(max_size=8)
paths = st.sampled_from(["run", "afile", "emptydir", "missing", "missing/deeper", ".", "run/config.yaml",
                         "run/metrics.jsonl", "policy", "spec.yaml", "notdir/x", "/dev/null", ""])
values = numbers | paths | words


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    """A scratch directory as the working directory: a run (config, metrics, samples), a policy
    directory, a sweep file, a plain file, an empty directory, and a file where a directory would be."""
    import tempfile

    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        root = Path(d)
        mp.chdir(root)
        run = root / "run"
        run.mkdir()
        (run / "config.yaml").write_text("model:\n  name: random:tiny\nalgo:\n  batch_groups: 2\n  group_size: 4\n")
        (run / "metrics.jsonl").write_text('{"step": 0, "time": 1, "eval_pass_rate": 0.25}\n'
                                           '{"step": 1, "time": 2, "reward_mean": 0.5}\n')
        (run / "samples.jsonl").write_text('{"step": 1, "reward": 1.0, "staleness": 0, "completion": "4"}\n')
        (root / "policy").mkdir()
        (root / "policy" / "config.json").write_text("{}")
        (root / "spec.yaml").write_text("name: s\nset: {train.steps: 1}\nseeds: [0, 1]\n")
        (root / "afile").write_text("not a directory\n")
        (root / "notdir").write_text("a file where a directory would be\n")
        (root / "emptydir").mkdir()
        yield root


def run_command(argv: list[str], stubs: dict[tuple[Any, str], Any]) -> dict[str, Any] | None:
    """Run `python -m aioareal ARGV` in-process with `stubs` in place: the arguments the work was
    reached with, or None when the command ended by itself (then checked: clean, one line)."""
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        for (owner, name), stub in stubs.items():
            mp.setattr(owner, name, stub)
        try:
            code = main(argv)
        except Reached as r:
            event("reached the work")
            return r.seen
        except SystemExit as e:  # argparse: the usage, then one 'error:' line, exit 2
            event("argparse's error")
            text = err.getvalue()
            assert e.code == 2 and "Traceback" not in text, (argv, text)
            assert text.rstrip("\n").splitlines()[-1].startswith(f"python -m aioareal {argv[0]}: error: "), text
            return None
    event("done" if code == 0 else "one line, exit 2")
    assert_clean(code, err.getvalue())
    return None


def flags(names: list[str]) -> st.SearchStrategy[list[str]]:
    """Some of `names`, each with a hostile value, in any order."""
    return st.lists(st.tuples(st.sampled_from(names), values), max_size=4).map(
        lambda pairs: [part for name, value in pairs for part in (name, value)])


def in_range(text: Any, lo: float, hi: float, zero_ok: bool = False) -> bool:
    value = float(text)
    return (zero_ok and value == 0) or (math.isfinite(value) and lo <= value <= hi)


@FUZZ
@given(paths, flags(["--max-new-tokens", "--temperature", "--system", "--config", "--prompt"]),
       st.lists(words | st.sampled_from(["generation.top_p=5", "data.system_prompt=x", "a.b=["]), max_size=2))
@example("policy", ["--temperature", "nan"], []).via("a NaN temperature sampled")
@example("policy", ["--temperature", "1e-300"], []).via("logits past float range: a traceback")
@example("policy", ["--max-new-tokens", "0"], []).via("no reply at all")
@example("policy", ["--max-new-tokens=-1"], []).via("transformers' ValueError: a traceback")
def test_chat_arguments(target: str, options: list[str], overrides: list[str]) -> None:
    from aioareal.use import chat

    with workspace():
        seen = run_command(["chat", target, "--prompt", "hi", *options, *overrides],
                           {(chat, "load_tokenizer"): reached(source=0)})
        if seen is not None:  # a reply was about to be written: the limits it would have been written under
            args = chat.parser().parse_intermixed_args([target, "--prompt", "hi", *options, *overrides])
            assert args.max_new_tokens is None or 1 <= args.max_new_tokens <= INT_MAX, options
            assert in_range(args.temperature, 0.001, math.inf, zero_ok=True), options


@FUZZ
@given(paths, flags(["-n", "--k", "--temperature", "--top-p", "--max-new-tokens", "--pass-threshold", "--seed",
                     "--out", "--config", "--protocol"]))
def test_eval_arguments(target: str, options: list[str]) -> None:
    from aioareal.use import eval_command

    with workspace():
        run_command(["eval", target, *options], {(eval_command, "evaluate_target"): reached(target=0)})


@FUZZ
@given(flags(["--temperature", "--max-new-tokens", "--pass-threshold", "--seed"]))
@example(["--temperature", "nan"]).via("accepted, sampled at NaN")
@example(["--max-new-tokens=-5"]).via("an IndexError in generation")
def test_eval_lets_through_only_values_in_range(options: list[str]) -> None:
    from aioareal.use import eval_command

    with workspace():
        seen = run_command(["eval", "policy", "-n", "2", *options],
                           {(eval_command, "evaluate_target"): reached(args=3)})
    if seen is not None:
        args = seen["args"]
        assert in_range(args.temperature, 0.001, math.inf), options
        assert args.max_new_tokens is None or 1 <= args.max_new_tokens <= INT_MAX, options
        assert math.isfinite(args.pass_threshold) and 0 <= args.seed < 2**32, options


@FUZZ
@given(st.sampled_from(["policy"]) | paths, flags(["--gguf", "--type", "--hub"]))
def test_export_arguments(target: str, options: list[str]) -> None:
    from aioareal.use import export

    with workspace():
        run_command(["export", target, *options], {(export, "write_gguf"): reached(out=1),
                                                   (export, "upload"): reached(repo=0)})


@FUZZ
@given(paths, flags(["--runs-root", "--shard"]), st.booleans())
def test_sweep_arguments(spec: str, options: list[str], dry_run: bool) -> None:
    from aioareal.lab.experiments import sweep

    with workspace():
        run_command(["sweep", spec, *options, *(["--dry-run"] if dry_run else [])],
                    {(sweep, "run_sweep"): reached(spec=0)})


@FUZZ
@given(st.sampled_from(["report", "plot"]), paths, flags(["--out", "--threshold"]))
@example("report", "run", ["--threshold", "nan"]).via("a time to threshold that is never reached")
@example("plot", "run", ["--threshold=-1"]).via("reached before any training")
def test_report_and_plot_arguments(command: str, path: str, options: list[str]) -> None:
    from aioareal.lab.experiments import plots, study_report

    drawn: list[Any] = []

    def no_figures(runs: Any, out_dir: Any, threshold: Any = None) -> list[Path]:
        drawn.append(threshold)
        Path(out_dir).mkdir(parents=True, exist_ok=True)  # where the figures would go
        return []

    with workspace():
        run_command([command, path, *options], {(plots, "plot_runs"): no_figures,
                                                (study_report, "plot_runs"): no_figures})
    for threshold in drawn:  # the runs were read and drawn: the threshold they were drawn with
        assert threshold is None or 0 <= threshold <= 1, options


@FUZZ
@given(paths, flags(["-n", "--step"]), st.sampled_from([[], ["--eval"], ["--last"], ["--best"], ["--worst"]]))
def test_samples_arguments(run: str, options: list[str], which: list[str]) -> None:
    with workspace():
        run_command(["samples", run, *options, *which], {})
