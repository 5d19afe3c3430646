"""Where code that may hang, crash or run out of memory runs: verifiers, users' reward functions and
tools (`reward.isolation` picks the stage for reward functions). `threads` (daemon threads, reused;
an overrun is abandoned and counted), `pool` (worker processes killed and replaced on overrun),
`spawn` and `worker` (a worker's start and its entry point), `guarded` (one call under a deadline,
from a plain thread). This package imports nothing: a spawned worker imports `isolation.worker`,
which must load only the standard library and the modules its jobs name."""
