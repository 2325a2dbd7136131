"""The runtime: loaded models (`loaded`), a request planned once against them (`plan`), one
generation as a coroutine (`generation`), the one scheduler that runs every generation
(`scheduler`), a plan run at any level (`run`: to its end, or streamed), and the one scorer
(`scoring`). Nothing here imports the `Ensemble` facade."""

from .completion import Completion
from .generation import Chunk, TokenEvent, completion_rng
from .loaded import LoadedModels
from .plan import Plan, plan
from .scheduler import Scheduler, State, Submission, run_completions
from .run import Stream, complete

__all__ = [
    "Chunk",
    "Completion",
    "LoadedModels",
    "Plan",
    "Scheduler",
    "Submission",
    "State",
    "Stream",
    "TokenEvent",
    "complete",
    "completion_rng",
    "plan",
    "run_completions",
]
