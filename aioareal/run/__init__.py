"""One training run: `recipe` (setup, train, cleanup, `--resume`), `cell` (the process shape, decided
once: one process or a torchrun rank), `build` (the builders of a run's parts, shared with bench),
`rollout` (single completions or episodes), `events` (the loop, stop signals, and per-step rows,
display and checkpoints), `early_checks` (before torch loads), `warmup` (the tiny model's supervised
start), `sft` (supervised fine-tuning), and the torchrun wiring (`sharded_cell`, `rank_hooks`)."""
