"""The reward service and where verifiers run: `service` (one deadline per group, failures counted),
`threads` (the fast path), `pool` (worker processes killed and replaced on timeout), `spawn` and
`worker` (a worker's start and its entry point). This package imports nothing: a spawned worker
imports `rewards.worker`, which must load only the standard library and the grader."""
