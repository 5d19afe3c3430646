"""torch.distributed primitives: `world` (ranks, process groups, timeouts, global reductions), `env`
(torchrun's variables), `sharding` (FSDP2, gathers). The run's wiring on top lives in `run/`."""
