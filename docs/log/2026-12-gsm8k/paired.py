"""Paired comparison of two evaluations of the same GSM8K test rows (greedy rows only, the rows both
files hold): `python paired.py BEFORE AFTER [FIELD]`, each an eval.jsonl (or .jsonl.gz) that `eval`
wrote; FIELD is the pass column (`passed` for zero-shot, `passed_strict` / `passed_flexible` for
lm-eval). Prints each pass rate and AFTER - BEFORE with standard errors over the shared rows."""
import gzip
import json
import math
import sys


def rows(path: str) -> dict:
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return {r["prompt_id"]: r for r in map(json.loads, f) if r.get("greedy")}


def mean_se(x: list[float]) -> tuple[float, float]:
    m = sum(x) / len(x)
    return m, math.sqrt(sum((a - m) ** 2 for a in x) / (len(x) - 1) / len(x))


before, after = rows(sys.argv[1]), rows(sys.argv[2])
field = sys.argv[3] if len(sys.argv) > 3 else "passed"
ids = [i for i in before if i in after]
b = [float(before[i][field]) for i in ids]
a = [float(after[i][field]) for i in ids]
print(f"rows {len(ids)}, {field}")
for name, x in (("before", b), ("after", a), ("after - before (paired)", [y - z for z, y in zip(b, a)])):
    print("{}: {:.4f} ± {:.4f}".format(name, *mean_se(x)))
for name, r in (("before", before), ("after", after)):
    print(f"{name}: mean length {sum(r[i]['length'] for i in ids) / len(ids):.1f}, "
          f"cut off {sum(r[i]['truncated'] for i in ids) / len(ids):.3f}")
print("both pass", sum(bool(x and y) for x, y in zip(b, a)),
      "before only", sum(bool(x and not y) for x, y in zip(b, a)),
      "after only", sum(bool(y and not x) for x, y in zip(b, a)))
