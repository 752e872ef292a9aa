"""The target as an engine is built over it: the model, the runner its forwards go through, its tokenizer.

A :class:`Target` is made once, where the model is loaded (:meth:`Target.from_loaded`), and
the runner is chosen then (:func:`~hvd_agents.runtime.runner_choice.runner_for`) or passed in
(:meth:`Target.of`); an engine takes it as it is. :meth:`Target.sibling` is the same model
and tokenizer over a new runner of its own, with the measured cost profile carried over: what
a benchmark arm or a second engine over one loaded model needs, in one call.

Example (loads the embedded SmolLM2-135M)::

    target = Target.from_loaded(load_model())
    engine = Engine(target, max_batch=4)
    other = Engine(target.sibling(), prefix_cache_bytes=0)   # same weights, its own KV and caches
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hvd_agents.policy.cost import CostModel
from hvd_agents.runtime.cpu.runner import NativeModel
from hvd_agents.runtime.loading import LoadedModel
from hvd_agents.runtime.runner import Runner
from hvd_agents.runtime.runner_choice import runner_for


@dataclass(frozen=True)
class Target:
    """The model being decoded, as an engine uses it.

    Attributes:
        model: the target model (any ``AutoModelForCausalLM``), in eval mode; the engine reads
            it only to fit a draft head or check a draft model's vocabulary.
        runner: the runner over ``model`` that every forward goes through.
        tokenizer: its tokenizer, or None (then events carry no text and stop strings are refused).
        eos_token_ids: the ids that end a request whose parameters name none.
        native: ``model``'s weights in the native CPU forward, when it has them (what
            :meth:`sibling` builds its runner over); None for a model that runs its own forward.

    Raises:
        ValueError: ``native`` holds another model's weights.
    """

    model: PreTrainedModel
    runner: Runner
    tokenizer: PreTrainedTokenizerBase | None = None
    eos_token_ids: tuple[int, ...] = ()
    native: NativeModel | None = None

    def __post_init__(self) -> None:
        if self.native is not None and self.native.model is not self.model:
            raise ValueError("the native forward given is over another model")

    @classmethod
    def of(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        eos_token_ids: Sequence[int] | None = None,
        context_window: int | None = None,
        cost_model: CostModel | None = None,
        runner: Runner | None = None,
        native: NativeModel | None = None,
    ) -> Target:
        """A target over ``model``: ``runner`` when given, else the one :func:`runner_for` picks.

        Args:
            model: the target model.
            tokenizer: its tokenizer (optional).
            eos_token_ids: defaults to the generation config's and the tokenizer's EOS ids.
            context_window: the most tokens a request may hold, for a runner chosen here
                (default: the model's ``max_position_embeddings``).
            cost_model: the verification cost profile, for a runner chosen here (measured on
                first use when omitted).
            runner: the runner to use as it is.
            native: ``model``'s weights in the native CPU forward (``LoadedModel.native``), when it
                has them: a runner chosen here is then the native one.
        """
        if runner is None:
            runner = runner_for(model, native=native, context_window=context_window, cost_model=cost_model)
        eos = tuple(eos_token_ids) if eos_token_ids is not None else default_eos(model, tokenizer)
        return cls(model, runner, tokenizer, eos, native)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, *, cost_model: CostModel | None = None,
                    runner: Runner | None = None) -> Target:
        """The target of a loaded model: its tokenizer, EOS ids, context window and native forward; the runner
        chosen for it.

        Args:
            loaded: what :func:`~hvd_agents.runtime.loading.load_model` returned.
            cost_model: as for :meth:`of`.
            runner: as for :meth:`of`.
        """
        return cls.of(loaded.model, loaded.tokenizer, eos_token_ids=loaded.eos_token_ids,
                      context_window=loaded.context_window, cost_model=cost_model, runner=runner,
                      native=loaded.native)

    def sibling(self, cost_model: CostModel | None = None) -> Target:
        """The same model, tokenizer, EOS ids, context window and native forward over a new runner (its own KV
        caches).

        Args:
            cost_model: the new runner's cost profile; this runner's (measured now if it was not yet)
                when omitted.
        """
        return Target.of(self.model, self.tokenizer, eos_token_ids=self.eos_token_ids,
                         context_window=self.runner.context_window,
                         cost_model=cost_model if cost_model is not None else self.runner.profile(),
                         native=self.native)


def default_eos(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> tuple[int, ...]:
    """The generation config's EOS ids and the tokenizer's, sorted."""
    ids: set[int] = set()
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is not None:
        ids.update([eos] if isinstance(eos, int) else eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))
