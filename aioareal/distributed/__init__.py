"""torch.distributed primitives: `world` (ranks, process groups, timeouts, global reductions, FSDP2 and
gathers), `env` (torchrun's variables, read without torch). The run's wiring on top lives in `run/`."""
