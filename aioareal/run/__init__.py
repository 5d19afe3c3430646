"""One training run: `recipe` (setup, train, cleanup), `cell` (the process shape, decided once: one
process or a torchrun rank), `build` (the builders of a run's parts, shared with bench), `hooks`
(rows, display, checkpoints per step), `evaluation`, `warmup` (the tiny model's supervised start),
`resume` (`--resume`), and the torchrun wiring (`session`, `rank_hooks`, `merge`)."""
