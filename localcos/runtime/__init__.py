"""The runtime: loaded models (`loaded`; their members, `members`; at the byte and mixed
levels, `bytelevel.ByteModels`), a request planned once against them (`plan`), one generation as a
coroutine (`generation`), the scheduler that runs the token level's generations together
(`scheduler`; the byte level's, one at a time, `bytescheduler`), a plan run at any level (`run`:
to its end, or streamed, through `models.scheduler_for`), the token level's scorer (`scoring`)
and what a front end holds (`models.LevelViews`). Nothing here imports the `Ensemble` facade."""

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
