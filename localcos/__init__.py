"""localcos: collaborative decoding of local GGUF models, made fast by speculation (CoS).

The Python API::

    from localcos import Ensemble, WeightedEnsemble, Contrastive
    ens = Ensemble.load(["a.gguf", "b.gguf"], WeightedEnsemble([0.5, 0.5]))
    completion = ens.generate("Once upon a time", method="cos", max_tokens=64, seed=0)
"""

__version__ = "0.1.0"

from .backend import Endpoint, Model, ModelStats, RemoteModel
from .core.combiners import BoundCombiner, Combiner, Contrastive, CustomCombiner, Gated, Guidance, LogitMix, WeightedEnsemble, make_combiner
from .core.decoding import METHODS, Origin
from .core.sampling import Sampler
from .config.specs import GenerationConfig
from .ensemble import ByteEnsemble, Ensemble
from .infill import ExtraChunk, Infill
from .runtime import Chunk, Completion, Stream, TokenEvent
from .errors import (
    ConfigError,
    LocalcosError,
    ModelFileError,
    ModelNotAvailableError,
    PromptTooLongError,
    RemoteError,
    RpcUnavailableError,
    TokenizerMismatchError,
)
from .stats import GenerationStats, ModelRunStats

__all__ = [
    "METHODS",
    "Chunk",
    "BoundCombiner",
    "ByteEnsemble",
    "Combiner",
    "Completion",
    "ConfigError",
    "Contrastive",
    "Endpoint",
    "Gated",
    "Guidance",
    "CustomCombiner",
    "Ensemble",
    "ExtraChunk",
    "GenerationConfig",
    "GenerationStats",
    "Infill",
    "LocalcosError",
    "LogitMix",
    "Model",
    "ModelFileError",
    "ModelNotAvailableError",
    "ModelRunStats",
    "ModelStats",
    "Origin",
    "PromptTooLongError",
    "RemoteError",
    "RemoteModel",
    "RpcUnavailableError",
    "Sampler",
    "Stream",
    "TokenEvent",
    "TokenizerMismatchError",
    "WeightedEnsemble",
    "make_combiner",
]
