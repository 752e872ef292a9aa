"""Trace replay: how many drafted tokens a target would have accepted on a recorded agent log.

Under greedy decoding the recorded assistant output IS what the target produced,
so each assistant message is replayed as a generation target:

* Conversations are replayed in file order; each policy keeps its drafter (and
  cache store) across all of them, as one deployment would.
* Assistant message ``i`` of a conversation: the prompt is
  ``analyze(tokenizer, messages[:i], tools, session_id=<conversation id>)``; the
  target is the reply as the model would emit it (:func:`reply_tokens`).
* The loop is the engine's (:class:`~hvd_agents.engine.request.Request`'s step): ``start``; per step
  ``k' = min(k, remaining - 1)``, a draft of at most ``k'`` tokens (none when
  ``k' = 0``), ``accepted`` = its common prefix with the rest of the target (for
  a tree draft: its longest path that the target follows), the
  accepted tokens plus one target token are emitted and observed; ``stop``.
* Every step is a :class:`~hvd_agents.trace.stats.ReplayStepRecord`, added to the
  policy's :class:`~hvd_agents.trace.stats.PolicyStats` and passed to an optional sink.

Optional transforms applied to each conversation first: canonical tool schemas
(:func:`hvd_agents.chat.prompt_templates.canonicalize_tools`) and a system-prompt template
(:func:`hvd_agents.chat.prompt_templates.apply_system_template`). They change the prompts
only: the recorded replies, hence the targets, stay as they are.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hvd_agents.chat.analyzer import analyze
from hvd_agents.chat.prompt_templates import Template, apply_system_template, canonicalize_tools
from hvd_agents.chat.render import render_prompt, to_template_messages
from hvd_agents.drafters import Draft, DraftContext, DraftOutcome
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.cost import FALLBACK_VERIFY_COST
from hvd_agents.policy.paper import PAPER_THRESHOLD, PaperMLP, TokenClasses
from hvd_agents.policy.payoff import PayoffWeights
from hvd_agents.policy.token_text import TokenText
from hvd_agents.structure import PromptStructure
from hvd_agents.trace.loader import Conversation, TraceFile
from hvd_agents.trace.stats import TARGET_KIND, PolicyStats, ReplayStepRecord, source_kind
from hvd_agents.trace.strategies import Policy, common_prefix, make_policy

logger = logging.getLogger(__name__)

END_OF_TURN = "<|im_end|>"

StepSink = Callable[[ReplayStepRecord], None]


@dataclass(frozen=True)
class ReplayConfig:
    """How to replay.

    Attributes:
        policies: resolved policy names (see :mod:`hvd_agents.trace.strategies`).
        k: most draft tokens verified per step.
        verify_cost: ``c`` of the cost model (the ``hvd`` policy decides with it).
        threshold: score threshold of ``suffix-threshold`` (None: ``k``).
        canonical_tools: canonicalize each conversation's tool schemas first.
        system_template: put this template at the start of each system prompt.
        highlight: conversation id whose tokens are kept with their provenance
            (None: the first conversation with an assistant turn).
        highlight_policy: the policy whose provenance is kept (None: the first of
            ``suffix``, ``suffix-local``, ``pld``, ... that is replayed).
        payoff_threshold: a cache draft is high-payoff when it keeps at least this many tokens; ``hvd-paper``
            verifies a cache draft predicted to keep more.
        paper_weights: the ``hvd-paper`` MLP's weights file (None: the packaged one).
        payoff_weights: ``hvd``'s predictor's weights file (``train-payoff``'s output; None: the packaged one).
    """

    policies: tuple[str, ...]
    k: int = 16
    verify_cost: float = FALLBACK_VERIFY_COST
    threshold: float | None = None
    canonical_tools: bool = False
    system_template: Template | None = None
    highlight: str | None = None
    highlight_policy: str | None = None
    payoff_threshold: float = PAPER_THRESHOLD
    paper_weights: str | None = None
    payoff_weights: str | None = None


@dataclass(frozen=True)
class Turn:
    """One assistant turn as a generation request."""

    conversation: str
    turn: int
    message_index: int
    structure: PromptStructure
    target: tuple[int, ...]


@dataclass
class HighlightTurn:
    """The reply tokens of one turn with the provenance kind of each (for the HTML report)."""

    message_index: int
    tokens: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


@dataclass
class ReplayResult:
    """Everything a report needs."""

    stats: dict[str, PolicyStats]
    conversations: int = 0
    turns: int = 0
    highlight_id: str | None = None
    highlight_policy: str | None = None
    highlight_turns: list[HighlightTurn] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The id of ``<|im_end|>`` if the tokenizer has that token, else None."""
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is None:
        return None
    token_id = convert(END_OF_TURN)
    unk = getattr(tokenizer, "unk_token_id", None)
    if not isinstance(token_id, int) or (token_id == unk and getattr(tokenizer, "unk_token", None) != END_OF_TURN):
        return None
    return token_id


def reply_tokens(tokenizer: Any, messages: Sequence[dict], tools: Sequence[dict] | None, index: int) -> list[int]:
    """The tokens of assistant message ``index`` as the model would emit them.

    The reply text is what the chat template puts after the generation prompt of
    ``messages[:index]`` up to ``<|im_end|>`` (the rendered conversation
    ``messages[:index + 1]`` minus the rendered prompt), i.e. the content then the
    tool calls as rendered for history; when the renderings do not line up that
    way, the lowered content of the message itself. It is tokenized on its own
    (``add_special_tokens=False``: the prompt's tokens are fixed, the model's
    output starts at a token boundary), followed by the ``<|im_end|>`` token when
    the tokenizer has one.
    """
    prompt = render_prompt(tokenizer, messages[:index], tools, add_generation_prompt=True)
    full = render_prompt(tokenizer, messages[: index + 1], tools, add_generation_prompt=False)
    reply = None
    if full.startswith(prompt):
        tail = full[len(prompt) :]
        cut = tail.find(END_OF_TURN)
        reply = tail[:cut] if cut >= 0 else None
    if reply is None:
        logger.debug("reply of message %d not found in the rendering; tokenizing its content", index)
        reply = to_template_messages(messages[: index + 1], tools)[-1]["content"]
    ids = list(tokenizer(reply, add_special_tokens=False).input_ids) if reply else []
    eot = end_of_turn_id(tokenizer)
    return ids + [eot] if eot is not None else ids


def prepare_conversation(conversation: Conversation, config: ReplayConfig) -> Conversation:
    """The conversation with the configured transforms applied (itself when none)."""
    if not config.canonical_tools and config.system_template is None:
        return conversation
    tools = canonicalize_tools(conversation.tools) if config.canonical_tools else conversation.tools
    messages = conversation.messages
    if config.system_template is not None:
        messages = apply_system_template(messages, config.system_template)
    return Conversation(conversation.id, messages, tools, conversation.line)


def conversation_turns(tokenizer: Any, conversation: Conversation) -> list[Turn]:
    """The assistant turns of a conversation as generation requests (empty targets are left out)."""
    turns = []
    for ordinal, index in enumerate(conversation.assistant_indices):
        if index == 0:
            logger.debug("%s: assistant message 0 has no prompt; skipped", conversation.id)
            continue
        tools = conversation.tools or None
        structure = analyze(tokenizer, conversation.messages[:index], tools, session_id=conversation.id)
        target = tuple(reply_tokens(tokenizer, conversation.messages, tools, index))
        if target:
            turns.append(Turn(conversation.id, ordinal, index, structure, target))
    return turns


def replay_turn(
    policy: Policy, turn: Turn, k: int, sink: StepSink, highlight: HighlightTurn | None = None,
    classes: TokenClasses | None = None,
) -> None:
    """Replay one turn with one policy, the engine's loop; every step goes to ``sink`` (with the
    punctuation and bracket flags of ``classes``, when given)."""
    classes = classes if classes is not None else TokenClasses()
    req_id = f"{turn.conversation}#{turn.message_index}"
    prompt = turn.structure.prompt_ids
    context = list(prompt)
    target = turn.target
    position = 0
    policy.start(req_id, turn.structure)
    try:
        while position < len(target):
            k_step = min(k, len(target) - position - 1)
            ctx = DraftContext(req_id, context, len(prompt))
            draft = policy.propose(ctx, k_step, target[position:]).truncated(k_step) if k_step > 0 else Draft()
            accepted = len(draft.path(target[position:]))  # a chain's common prefix; a tree's matching path
            emitted = target[position : position + accepted + 1]
            probe = policy.probe(req_id) if k_step > 0 else None
            policy.observe(DraftOutcome(req_id, draft, accepted, emitted))
            cache = probe.cache_tokens if probe is not None else ()
            arm = probe.arm if probe is not None else ("cache" if draft.token_ids else "none")
            flags = classes.flags(context[-1] if context else None, cache[0] if cache else None)
            sink(ReplayStepRecord(policy.name, turn.conversation, turn.turn, turn.message_index, position,
                            draft.source, len(draft), accepted, draft.features, arm, len(cache),
                            common_prefix(cache, target[position:]), probe.predicted if probe else None, flags,
                            probe.features if probe is not None and cache else None))
            context.extend(emitted)
            if highlight is not None:
                highlight.tokens.extend(emitted)
                highlight.kinds.extend([source_kind(draft.source)] * accepted + [TARGET_KIND])
            position += accepted + 1
    finally:
        policy.stop(req_id)


def replay_trace(
    tokenizer: Any,
    trace: TraceFile,
    config: ReplayConfig,
    *,
    step_sink: StepSink | None = None,
    progress: bool = True,
) -> ReplayResult:
    """Replay every conversation of a trace with every configured policy.

    Args:
        tokenizer: renders and tokenizes the conversations (HF tokenizer or adapter).
        trace: from :func:`hvd_agents.trace.loader.load_trace`.
        config: policies, k, transforms.
        step_sink: receives every :class:`ReplayStepRecord` (e.g. the ``--steps`` writer).
        progress: show a progress bar on stderr (only when it is a terminal).

    Raises:
        InvalidRequestError: ``k`` < 1 or no policy.
    """
    if config.k < 1:
        raise InvalidRequestError(f"k must be >= 1, got {config.k}")
    if not config.policies:
        raise InvalidRequestError("no policy to replay")
    threshold = float(config.k if config.threshold is None else config.threshold)
    classes = TokenClasses.from_tokenizer(tokenizer) if "hvd-paper" in config.policies or step_sink else None
    text = TokenText.from_tokenizer(tokenizer)
    paper = PaperMLP.load(config.paper_weights) if config.paper_weights else None
    payoff = PayoffWeights.load(config.payoff_weights) if config.payoff_weights else None
    policies = [make_policy(name, threshold=threshold, verify_cost=config.verify_cost,
                            payoff_threshold=config.payoff_threshold, paper=paper, classes=classes, text=text,
                            payoff=payoff)
                for name in config.policies]
    result = ReplayResult({p.name: PolicyStats(p.name, payoff_threshold=config.payoff_threshold) for p in policies})
    result.highlight_policy = config.highlight_policy or _default_highlight_policy(config.policies)

    def sink(step: ReplayStepRecord) -> None:
        result.stats[step.policy].add_step(step)
        if step_sink is not None:
            step_sink(step)

    for conversation in _progress(trace.conversations, progress):
        turns = conversation_turns(tokenizer, prepare_conversation(conversation, config))
        result.conversations += 1
        result.turns += len(turns)
        keep = bool(turns) and _is_highlight(result, conversation.id, config.highlight)
        if keep:
            result.highlight_id = conversation.id
        for turn in turns:
            mark = HighlightTurn(turn.message_index) if keep else None
            for policy in policies:
                result.stats[policy.name].add_request(len(turn.target))
                replay_turn(policy, turn, config.k, sink, mark if policy.name == result.highlight_policy else None,
                            classes)
            if mark is not None:
                result.highlight_turns.append(mark)
    if config.highlight is not None and result.highlight_id is None:
        result.notes.append(f"conversation {config.highlight!r} has no replayed assistant turn; none highlighted")
    return result


def _default_highlight_policy(names: Sequence[str]) -> str | None:
    for name in ("hvd", "suffix", "suffix-threshold", "suffix-local", "pld", "arctic", "oracle"):
        if name in names:
            return name
    return names[0] if names else None


def _is_highlight(result: ReplayResult, conversation_id: str, wanted: str | None) -> bool:
    if wanted is not None:
        return conversation_id == wanted and result.highlight_id is None
    return result.highlight_id is None


def _progress(items: Sequence[Conversation], enabled: bool):
    """``items`` wrapped in a tqdm bar on stderr when enabled and stderr is a terminal."""
    if not enabled or not sys.stderr.isatty():
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc="conversations", unit="conv", file=sys.stderr)
