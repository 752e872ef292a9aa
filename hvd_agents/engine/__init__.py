"""The decode engine (token ids in, token events out)."""

from hvd_agents.engine.constraint import Constraint
from hvd_agents.engine.engine import Engine, GenerationResult
from hvd_agents.engine.params import GenerationParams
from hvd_agents.engine.prefix_cache import PrefixCache, PrefixCacheStats, PrefixMatch
from hvd_agents.engine.sampling import SamplingParams
from hvd_agents.engine.stats import RequestStats, SourceStats, StepRecord, TokenEvent, VerifyStepRecord

__all__ = [
    "Constraint",
    "Engine",
    "GenerationParams",
    "GenerationResult",
    "PrefixCache",
    "PrefixCacheStats",
    "PrefixMatch",
    "RequestStats",
    "SamplingParams",
    "SourceStats",
    "StepRecord",
    "TokenEvent",
    "VerifyStepRecord",
]
