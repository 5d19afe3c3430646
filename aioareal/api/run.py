"""`Run`: one run directory as Python objects, read from its files when asked (a run still
training, or resumed elsewhere, is read as it stands): the resolved config, the metrics and samples
as pandas DataFrames, the trained policy's directory, and the policy's replies; and
`aioareal.evaluate`, the `eval` command's scoring from Python, its figures returned."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import UserError
from ..io import iter_jsonl


@dataclass
class Run:
    run_dir: Path
    stopped: bool = False  # stopped on request (on_step, an interrupt) before train.steps: resume it
    _talk: Any = field(default=None, repr=False, compare=False)  # the loaded policy, after the first chat

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        if not (self.run_dir / "config.yaml").is_file():
            raise UserError(f"{self.run_dir}: not a run directory (no config.yaml inside)")

    @property
    def config(self) -> Any:
        """The config the run trains under (config.yaml), as typed dataclasses."""
        from ..config import load_config

        return load_config(self.run_dir / "config.yaml")

    @property
    def metrics(self) -> pd.DataFrame:
        """metrics.jsonl, one row a step in step order (a step a resume repeated: its last write)."""
        frame = self._frame("metrics.jsonl")
        if "step" in frame.columns:
            frame = frame.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)
        return frame

    @property
    def samples(self) -> pd.DataFrame:
        """samples.jsonl: completions the trainer trained on, with their rewards."""
        return self._frame("samples.jsonl")

    @property
    def eval_samples(self) -> pd.DataFrame:
        """eval_samples.jsonl: each held-out evaluation's completions, under its step."""
        return self._frame("eval_samples.jsonl")

    @property
    def step(self) -> int:
        """The last step written to metrics.jsonl (0 before the first)."""
        frame = self.metrics
        return int(frame["step"].max()) if "step" in frame.columns and len(frame) else 0

    @property
    def policy_path(self) -> Path | None:
        """The latest checkpoint's policy, a Hugging Face model directory (None before the first)."""
        from .. import checkpoint

        latest = checkpoint.latest_checkpoint(self.run_dir)
        return latest / checkpoint.POLICY_DIR if latest else None

    def evaluate(self, *baselines: Any, **options: Any) -> dict[str, Any]:
        """`aioareal.evaluate(*baselines, run)`: the baselines and this run side by side."""
        return evaluate(*baselines, self, **options)

    def chat(self, prompt: str, max_new_tokens: int | None = None, temperature: float = 0.0,
             system: str | None = None, stream: bool = True) -> str:
        """The policy's reply, a turn of one conversation that later calls continue (`reset` forgets it);
        the policy loads on the first call. `stream`: print the reply as it comes."""
        if self._talk is None or (max_new_tokens, temperature, system) != self._talk[0]:
            from ..use.chat import open_conversation

            self._talk = ((max_new_tokens, temperature, system),
                          open_conversation(str(self.run_dir), [], None, system, max_new_tokens, temperature))
        return self._talk[1].reply(prompt, stream=stream)

    def generate(self, prompts: list[str], max_new_tokens: int | None = None, temperature: float = 0.0) -> list[str]:
        """One reply to each prompt, each on its own (no conversation), nothing printed."""
        replies = []
        for prompt in prompts:
            self.reset()
            replies.append(self.chat(prompt, max_new_tokens, temperature, stream=False))
        self.reset()
        return replies

    def reset(self) -> None:
        """Forget the conversation `chat` holds."""
        if self._talk is not None:
            self._talk[1].history.clear()

    def _frame(self, name: str) -> pd.DataFrame:
        path = self.run_dir / name
        return pd.DataFrame(list(iter_jsonl(path, skip_bad=True)) if path.is_file() else [])


def evaluate(*targets: Any, protocol: str = "zero-shot", n: int = 0, k: str | int | None = None,
             temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int | None = None,
             pass_threshold: float = 1.0, seed: int = 0, out: str | Path | None = None,
             config: str | Path | None = None, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Score targets side by side as `python -m aioareal eval` does (a run, a checkpoint, a model);
    returns its figures (also written to OUT/figures.json, with every completion in OUT/eval.jsonl)."""
    from ..use.eval_command import parser, run_eval

    out = Path(out) if out is not None else Path("runs") / time.strftime("eval-%Y%m%d-%H%M%S")
    argv = [str(getattr(t, "run_dir", t)) for t in targets]
    argv += [f"{key}={json.dumps(v) if not isinstance(v, str) else v}" for key, v in (settings or {}).items()]
    argv += ["--protocol", protocol, "-n", str(n), "--temperature", str(temperature), "--top-p", str(top_p),
             "--pass-threshold", str(pass_threshold), "--seed", str(seed), "--out", str(out)]
    argv += ["--k", str(k)] if k is not None else []
    argv += ["--max-new-tokens", str(max_new_tokens)] if max_new_tokens is not None else []
    argv += ["--config", str(config)] if config is not None else []
    run_eval(parser().parse_intermixed_args(argv))
    return json.loads((out / "figures.json").read_text(encoding="utf-8"))
