"""Checkpoints: one process's, atomic, and the run directory's one writer (`atomic`), sharded ones
written by several ranks (`sharded`, on torch.distributed.checkpoint), the readers that never run
code from a file (`safeload`) and every decision a `--resume` takes (`resume_plan`). The atomic API is re-exported here:
`checkpoint.save(...)`, `checkpoint.latest_readable(...)`."""
from .atomic import (
                    ADAPTER_DIR,
                    DONE_FILE,
                    POLICY_DIR,
                    PREFIX,
                    SFT_MARKER,
                    SHARDS,
                    RunState,
                    begin,
                    broken_checkpoints,
                    check_readable,
                    checkpoint_dir,
                    clear_done,
                    commit,
                    husks,
                    is_done,
                    latest_checkpoint,
                    latest_readable,
                    list_checkpoints,
                    load_rng,
                    load_state,
                    load_trainer_state,
                    mark_done,
                    restore,
                    restore_rng,
                    rng_state,
                    run_policy,
                    save,
                    temp_dir,
                    write_policy,
)

__all__ = ["ADAPTER_DIR", "DONE_FILE", "POLICY_DIR", "PREFIX", "SFT_MARKER", "SHARDS", "RunState", "begin",
           "broken_checkpoints", "check_readable", "checkpoint_dir", "clear_done", "commit", "husks", "is_done",
           "latest_checkpoint", "latest_readable", "list_checkpoints", "load_rng", "load_state",
           "load_trainer_state", "mark_done", "restore", "restore_rng", "rng_state", "run_policy", "save",
           "temp_dir", "write_policy"]
