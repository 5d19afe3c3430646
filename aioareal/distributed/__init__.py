"""torch.distributed primitives: `world` (ranks, process groups, timeouts), `env` (torchrun's
variables), `reduce` (global sums), `sharding` (FSDP2, gathers). The run's wiring on top of them lives
in `run/`; the sharded checkpoints in `checkpoint/`."""
