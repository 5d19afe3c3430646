"""The async orchestrator: the prompt source, admission, oldest-first batching, the generator and trainer
coroutines."""
from ..monitor.metrics import StepReport
from .loop import Admission, Hooks, Ledger, OldestFirstBuffer, Orchestrator, PromptSource, Schedule
from .workers import EngineWorker, TrainerWorker

__all__ = ["Admission", "EngineWorker", "Hooks", "Ledger", "OldestFirstBuffer", "Orchestrator", "PromptSource",
           "Schedule", "StepReport", "TrainerWorker"]
