"""`python -m aioareal simulate`: predict what sync, one-step and async at each K buy on some
hardware, by running the real orchestrator on the virtual clock with a cost profile's latencies.

  profile   the cost profile (JSON): fitted decode / prefill / train costs, publish, adopt, reward,
            contention; measured by `bench profile`, or derived from one by `derive`
  cell      how generator and trainer share hardware: one device (contention), two, N cells
  workers   profile-costed generator and trainer (the GenerationWorker / TrainingWorker contracts)
  runner    one simulated run of the real Orchestrator, summarised as `bench e2e` summarises
  lengths   completion-length distributions (shared with bench e2e)
  command   the CLI: a table of predictions, a JSON line, a plot; `--against` a bench e2e file

Nothing is imported here: `bench` imports `simulate.lengths` without the rest.
"""
