"""A cost profile: what one generator step and one training step cost on some hardware, as a few
fitted lines, written as JSON (`bench profile` measures one; `derive` scales one to other GPUs).

Each cost is a linear model whose terms say what the work scales with:
  decode   seconds of one engine step with n slots decoded over an attention span:
           a + b*n + c*n*span  (a: weights read + launches + per-step host work; b: per-sequence
           matmul rows, sampling, bookkeeping; c: attention over the KV cache)
  prefill  extra seconds of a step that prefills p prompts padded to width w:
           a + b*p*w + c*p*w^2 (c: attention's quadratic part); also the KV recompute after a
           weight update mid-rollout (p running sequences, w their longest prefix)
  train    seconds of one training step on `tokens` token positions the trainer computes (padding
           included, at the profile's micro-batch budget; real tokens in older and published
           profiles: `unit`), publish excluded: a + b*tokens
plus fixed seconds for publishing and adopting a version and for scoring one group, and the
contention factors of a single-device cell: how much slower a train step runs while the generator
decodes (and a decode step while the trainer trains) than alone. Every number says where it came
from: `kind` is "measured" or "derived", and `notes` / `derivation` list the sources.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import UserError
from ...group import Sample
from ...trainer.batching import Layouts, computed_positions

FORMAT = "aioareal-profile/1"


def fit(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares y ~ rows @ coef in relative terms (each residual divided by its y: points span
    two orders of magnitude, and a 10 ms miss on a 20 ms step matters more than on a 2 s one), with
    every coefficient >= 0: a negative one (noise in a term that barely matters) is dropped and the
    rest refitted, so a cost never shrinks as work grows."""
    weight = 1.0 / np.maximum(np.array(ys, dtype=float), 1e-12)
    active = list(range(len(rows[0])))
    while True:
        x = np.array([[r[i] for i in active] for r in rows], dtype=float) * weight[:, None]
        coef = np.linalg.lstsq(x, np.ones(len(ys)), rcond=None)[0]
        if (coef >= 0).all() or len(active) == 1:
            out = [0.0] * len(rows[0])
            for i, c in zip(active, coef):
                out[i] = max(0.0, float(c))
            return out
        active.pop(int(coef.argmin()))


@dataclass
class DecodeCost:
    a: float
    b: float
    c: float
    points: list[list[float]] = field(default_factory=list)  # [n, span, seconds] as measured

    def seconds(self, n: int, span: int) -> float:
        return self.a + self.b * n + self.c * n * span

    @classmethod
    def fitted(cls, points: list[list[float]]) -> DecodeCost:
        return cls(*fit([[1.0, n, n * s] for n, s, _ in points], [t for *_, t in points]), points=points)

    def predicted(self) -> list[float]:
        return [self.seconds(n, s) for n, s, _ in self.points]


@dataclass
class PrefillCost:
    a: float
    b: float
    c: float
    points: list[list[float]] = field(default_factory=list)  # [prompts, width, seconds]

    def seconds(self, prompts: int, width: int) -> float:
        return self.a + self.b * prompts * width + self.c * prompts * width * width if prompts else 0.0

    @classmethod
    def fitted(cls, points: list[list[float]]) -> PrefillCost:
        rows = [[1.0, p * w, p * w * w] for p, w, _ in points]
        return cls(*fit(rows, [t for *_, t in points]), points=points)

    def predicted(self) -> list[float]:
        return [self.seconds(int(p), int(w)) for p, w, _ in self.points]


@dataclass
class TrainCost:
    a: float
    b: float
    points: list[list[float]] = field(default_factory=list)  # [tokens, seconds]
    # What `tokens` counts: "tokens", the real prompt + completion tokens (profiles derived from
    # published figures), or "positions", what the trainer computes (batching.computed_positions,
    # padding included) at this micro-batch `budget`, with or without shared prompts (`share`).
    # The prefix tree (trainer/prefix_tree.py) is not modelled: simulated completions have lengths,
    # not tokens, so what they share is unknown (the profile's random-token batches share none).
    unit: str = "tokens"
    budget: int = 0
    share: bool = False

    def seconds(self, tokens: int) -> float:
        return self.a + self.b * tokens

    def count(self, samples: list[Sample]) -> int:
        """The samples' size in this cost's unit."""
        if self.unit == "positions":
            return computed_positions(samples, self.budget, Layouts(share=self.share))
        return sum(len(s.prompt_ids) + len(s.tokens) for s in samples)

    @classmethod
    def fitted(cls, points: list[list[float]], **unit: Any) -> TrainCost:
        return cls(*fit([[1.0, n] for n, _ in points], [t for _, t in points]), points=points, **unit)

    def predicted(self) -> list[float]:
        return [self.seconds(int(n)) for n, _ in self.points]


@dataclass
class Contention:
    """Slowdown of each side while the other works on the same device (1.0: none)."""

    gen: float = 1.0
    train: float = 1.0
    how: str = ""


@dataclass
class Profile:
    name: str
    kind: str  # "measured" or "derived"
    device: str
    model: str
    dtype: str
    decode: DecodeCost
    prefill: PrefillCost
    train: TrainCost
    publish_s: float  # trainer side: stage a version for the generator
    adopt_s: float  # generator side: copy the staged version into its weights
    reward_s: float  # score one group (the reward service's round trip)
    contention: Contention
    param_count: int  # for the all-reduce of N cells and the weight copies of derived profiles
    setup: dict[str, Any] = field(default_factory=dict)  # the bench setting it was measured in
    link_gbps: float = 0.0  # device-to-device bandwidth (two-device cells, all-reduce); 0: unknown
    notes: list[str] = field(default_factory=list)
    derivation: dict[str, Any] = field(default_factory=dict)  # derived profiles: sources and factors
    format: str = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.to_json() + "\n")


_PARTS = {"decode": DecodeCost, "prefill": PrefillCost, "train": TrainCost, "contention": Contention}


def load_profile(path: str | Path) -> Profile:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--profile {path}: no such file (measure one with `python -m aioareal bench profile`, "
                        "or pick one in configs/profiles/)")
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{p}: not JSON ({e})") from e
    return profile_from_dict(raw, str(p))


def profile_from_dict(raw: Any, where: str) -> Profile:
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise UserError(f"{where}: expected a cost profile with \"format\": \"{FORMAT}\"")
    names = {f.name for f in fields(Profile)}
    missing = sorted(n for n in names if n not in raw and fields_required(n))
    unknown = sorted(set(raw) - names)
    if missing or unknown:
        raise UserError(f"{where}: profile fields missing {missing or 'none'}, unknown {unknown or 'none'}")
    values = dict(raw)
    for name, cls in _PARTS.items():
        try:
            values[name] = cls(**raw[name])
        except TypeError as e:
            raise UserError(f"{where}: field '{name}': {e}") from e
    profile = Profile(**values)
    check_profile(profile, where)
    return profile


def fields_required(name: str) -> bool:
    return name not in ("setup", "link_gbps", "notes", "derivation", "format")


def check_profile(p: Profile, where: str) -> None:
    costs = {"decode.a": p.decode.a, "decode.b": p.decode.b, "decode.c": p.decode.c, "prefill.a": p.prefill.a,
             "prefill.b": p.prefill.b, "prefill.c": p.prefill.c, "train.a": p.train.a, "train.b": p.train.b,
             "publish_s": p.publish_s, "adopt_s": p.adopt_s, "reward_s": p.reward_s}
    if p.train.unit not in ("tokens", "positions") or (p.train.unit == "positions" and p.train.budget <= 0):
        raise UserError(f"{where}: train.unit must be 'tokens' or 'positions' (with a train.budget > 0), "
                        f"got {p.train.unit!r} (budget {p.train.budget})")
    bad = [k for k, v in costs.items() if not isinstance(v, (int, float)) or v < 0]
    if bad:
        raise UserError(f"{where}: {', '.join(bad)} must be numbers >= 0")
    if p.decode.seconds(1, 1) <= 0 or p.train.seconds(1) <= 0:
        raise UserError(f"{where}: a decode step and a train step must cost some time (all coefficients are 0)")
    if p.contention.gen < 1 or p.contention.train < 1:
        raise UserError(f"{where}: contention factors are slowdowns, expected >= 1, got "
                        f"gen {p.contention.gen}, train {p.contention.train}")
    if p.kind not in ("measured", "derived"):
        raise UserError(f"{where}: kind must be 'measured' or 'derived', got {p.kind!r}")
