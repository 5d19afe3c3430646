"""Which of the package's files run from the orchestrator's loop on (the step itself, its hooks and the end of
the run, not setup), in a one-step default run: `python docs/log/2026-12-house/step_only.py . /tmp/new-run-dir`."""
import os
import sys
import threading

checkout, run_dir = sys.argv[1], sys.argv[2]
pkg = os.path.join(os.path.abspath(checkout), "aioareal") + os.sep
seen, on = set(), [False]


def hook(frame, event, arg):
    if event == "call" and frame.f_code.co_name != "<module>":
        f = frame.f_code.co_filename
        if f.startswith(pkg):
            rel = f[len(pkg):]
            if rel == os.path.join("orchestrator", "loop.py") and frame.f_code.co_name == "run":
                on[0] = True
            if on[0]:
                seen.add(rel)


sys.path.insert(0, os.path.abspath(checkout))
os.chdir(checkout)
threading.setprofile(hook)
sys.setprofile(hook)
from aioareal import cli  # noqa: E402 (imported from the checkout put on sys.path above)

try:
    rc = cli.main(["--steps", "1", "--no-dashboard", "--run-dir", run_dir, "eval.every=0"])
except SystemExit as e:
    rc = e.code
sys.setprofile(None)
threading.setprofile(None)
print(f"rc {rc}; files executed from Orchestrator.run on: {len(seen)}")
for p in sorted(seen):
    print(" ", p)
