"""`aioareal.evaluate`: the `eval` command's scoring from Python, its figures returned."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


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
