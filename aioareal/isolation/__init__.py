"""Where code that may hang, crash or run out of memory runs: verifiers, users' reward functions and
tools. `threads` (daemon threads, reused; an overrun is abandoned and counted; `GuardedCaller`, one
call under a deadline from a plain thread), `pool` (worker processes killed and replaced on overrun),
`worker` (a worker's start and entry point). This package imports nothing: a spawned
worker imports `isolation.worker`, which loads only the standard library and what its jobs name."""
