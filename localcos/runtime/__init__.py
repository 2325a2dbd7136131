"""The runtime: loaded models (`loaded`), a request planned once against them (`plan`), one
generation as a coroutine (`generation`), the one scheduler that runs every generation
(`scheduler`), one completion streamed at any level (`stream`), and the one scorer
(`scoring`). Nothing here imports the `Ensemble` facade."""

from .completion import Completion
from .generation import Chunk, TokenEvent, completion_rng
from .loaded import LoadedModels
from .plan import Plan, plan
from .scheduler import Scheduler, State, Submission, run_completions
from .stream import Stream

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
    "completion_rng",
    "plan",
    "run_completions",
]
