"""The async orchestrator: admission, oldest-first batching, the generator and trainer coroutines."""
from .admission import Admission, Ledger, OldestFirstBuffer
from .loop import Orchestrator, Schedule
from .workers import EngineWorker, TrainerWorker

__all__ = ["Admission", "EngineWorker", "Ledger", "OldestFirstBuffer", "Orchestrator", "Schedule", "TrainerWorker"]
