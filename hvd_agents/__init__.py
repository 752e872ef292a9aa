"""hvd-agents: a local LLM backend that decodes with Hybrid Verified Decoding.

Lossless speculative decoding for agent loops: drafts copied from the context and
from registered prompt structure are verified by the target model in one forward
pass each; greedy output equals plain greedy decoding token for token.
"""

from hvd_agents.engine import (
    Engine,
    GenerationParams,
    GenerationResult,
    RequestStats,
    SamplingParams,
    TokenEvent,
)
from hvd_agents.errors import (
    ContextLengthError,
    HVDError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    QueueFullError,
    RequestTimeoutError,
)

__version__ = "0.1.0"

__all__ = [
    "ContextLengthError",
    "Engine",
    "GenerationParams",
    "GenerationResult",
    "HVDError",
    "InvalidRequestError",
    "ModelLoadError",
    "ModelNotFoundError",
    "QueueFullError",
    "RequestStats",
    "RequestTimeoutError",
    "SamplingParams",
    "TokenEvent",
    "__version__",
]
