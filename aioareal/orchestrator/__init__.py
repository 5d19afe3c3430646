"""The async orchestrator: admission, oldest-first batching, the generator and trainer coroutines."""
from .admission import Admission, Ledger, OldestFirstBuffer
from .loop import Hooks, Orchestrator, Schedule
from .step_report import StepReport
from .workers import EngineWorker, TrainerWorker

__all__ = ["Admission", "EngineWorker", "Hooks", "Ledger", "OldestFirstBuffer", "Orchestrator", "Schedule",
           "StepReport", "TrainerWorker"]
