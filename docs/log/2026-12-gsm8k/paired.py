"""Paired comparison of two zero-shot evaluations of the same GSM8K test rows (greedy rows only):
base (argv[1], an eval.jsonl) against the SFT adapter's committed rows. Run from the repository root."""
import gzip, json, math, sys
base = {r["prompt_id"]: r for r in map(json.loads, open(sys.argv[1])) if r.get("greedy")}
sft = {r["prompt_id"]: r for r in map(json.loads, gzip.open("docs/log/2026-12-gsm8k/sft-zero-shot.jsonl.gz", "rt"))}
ids = [i for i in base if i in sft]
n = len(ids)
b = [float(base[i]["passed"]) for i in ids]; s = [float(sft[i]["passed"]) for i in ids]
def mse(x):
    m = sum(x) / len(x); v = sum((a - m) ** 2 for a in x) / (len(x) - 1); return m, math.sqrt(v / len(x))
d = [y - x for x, y in zip(b, s)]
print(f"rows {n}")
for name, x in (("base", b), ("sft", s), ("sft-base (paired)", d)):
    m, se = mse(x); print(f"{name}: {m:.4f} ± {se:.4f}")
for name, rows in (("base", base), ("sft", sft)):
    L = [rows[i]["length"] for i in ids]; t = [rows[i]["truncated"] for i in ids]
    print(f"{name}: mean length {sum(L)/n:.1f}, cut off {sum(t)/n:.3f}")
print("both pass", sum(1 for x, y in zip(b, s) if x and y), "base only", sum(1 for x, y in zip(b, s) if x and not y), "sft only", sum(1 for x, y in zip(b, s) if y and not x))
