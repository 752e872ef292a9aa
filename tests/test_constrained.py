"""Constrained decoding is lossless: every method gives plain constrained decoding's tokens.

On a tiny random Llama (float64) over the byte-level test tokenizer: random JSON schemas and
adversarial drafts (grammar-valid but wrong tokens at every depth, trees, distributions q),
each method (``hvd``, ``hvd-cache``, ``pld``, ``model`` over a draft LM, batched, chunked,
resumed) equal to constrained ``ar`` token for token; the output validates against its
schema; constrained sampling follows the masked target distribution (chi-square); and a
planted bug (each row masked by the state one position late) fails the equality.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Sequence

import jsonschema
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hvd_agents import Engine, GenerationParams
from hvd_agents.drafters import Draft, DraftContext, DraftOutcome
from hvd_agents.engine import Constraint
from hvd_agents.engine.grammar import GrammarState
from hvd_agents.engine.sampling import target_probs
from hvd_agents.errors import InvalidRequestError
from tests.helpers import make_byte_tokenizer
from tests.test_engine_lossless import chi_square, chi_square_critical
from tests.tiny import make_tiny_llama

END = "<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer():
    return make_byte_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return make_tiny_llama(len(tokenizer), seed=11)


@pytest.fixture(scope="module")
def engine(model, tokenizer) -> Engine:
    draft_lm = make_tiny_llama(len(tokenizer), seed=12)
    return Engine(model, tokenizer, eos_token_ids=(tokenizer.convert_tokens_to_ids(END),), draft_model=draft_lm,
                  draft_head=None)


class GrammarNoiseDrafter:
    """Adversarial drafts the grammar accepts: a correct prefix of random length, then random tokens
    the grammar allows (found by trial through ``ctx.grammar``), as chains or as trees of alternatives."""

    def __init__(self, oracle: Sequence[int], vocab_size: int, seed: int, trees: bool = False) -> None:
        self.oracle, self.vocab_size, self.rng, self.trees = list(oracle), vocab_size, random.Random(seed), trees

    def start(self, req_id, prompt_ids, structure=None) -> None:
        pass

    def _valid_noise(self, ctx: DraftContext, prefix: list[int], length: int) -> list[int]:
        tokens = list(prefix)
        for _ in range(length):
            for _ in range(40):
                token = self.rng.randrange(self.vocab_size)
                if ctx.grammar.allows([*tokens, token]) == len(tokens) + 1:
                    tokens.append(token)
                    break
            else:
                break
        return tokens[len(prefix):]

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        pos = ctx.num_output_tokens
        good = self.oracle[pos: pos + self.rng.randint(0, k)]
        chain = good + self._valid_noise(ctx, good, self.rng.randint(0, k))
        if not self.trees or not chain:
            return Draft(tuple(chain[: 2 * k]), source="noise")
        alt = self._valid_noise(ctx, [], 2)  # an alternative branch from the root
        tokens, parents = list(chain), list(range(-1, len(chain) - 1))
        for i, token in enumerate(alt):
            if i == 0 and token == chain[0]:
                break
            tokens.append(token)
            parents.append(-1 if i == 0 else len(tokens) - 2)
        return Draft(tuple(tokens), source="noise-tree", parents=tuple(parents))

    def observe(self, outcome: DraftOutcome) -> None:
        pass

    def stop(self, req_id) -> None:
        pass


def leaf_schema() -> st.SearchStrategy:
    return st.one_of(
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(1, 8)),
        st.just({"type": "integer"}),
        st.just({"type": "boolean"}),
        st.lists(st.sampled_from(["red", "green", "blue", "thin", "there"]), min_size=1, max_size=3, unique=True)
        .map(lambda values: {"enum": values}),
        st.builds(lambda n: {"type": "array", "items": {"type": "integer"}, "maxItems": n}, st.integers(1, 3)),
    )


def object_schema(values: st.SearchStrategy) -> st.SearchStrategy:
    def build(props: dict, required_mask: list[bool]) -> dict:
        names = list(props)
        return {"type": "object", "properties": props, "additionalProperties": False,
                "required": [name for name, req in zip(names, required_mask) if req]}

    props = st.dictionaries(st.sampled_from(["a", "city", "the", "n", "ok", "there"]), values, min_size=1, max_size=3)
    return props.flatmap(lambda p: st.lists(st.booleans(), min_size=len(p), max_size=len(p)).map(
        lambda mask: build(p, mask)))


SCHEMAS = st.recursive(leaf_schema(), object_schema, max_leaves=6).filter(lambda s: s.get("type") == "object") | \
    object_schema(leaf_schema())


def constrained(method: str, schema: dict, max_new: int, k: int | None = None, **extra) -> GenerationParams:
    return GenerationParams(max_new_tokens=max_new, method=method, num_draft_tokens=k,
                            constraint=Constraint.json_schema(schema), **extra)


def check_valid(tokenizer, result, schema: dict) -> None:
    """A reply that ended by itself is JSON valid against its schema."""
    if result.finish_reason == "stop":
        jsonschema.validate(json.loads(result.text), schema)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, prompt=st.text(alphabet="abcdefgh {}", min_size=1, max_size=12), max_new=st.integers(1, 60),
       k=st.integers(1, 10), seed=st.integers(0, 10_000), trees=st.booleans())
def test_adversarial_grammar_valid_drafts_give_constrained_ar(engine, tokenizer, schema, prompt, max_new, k, seed,
                                                             trees) -> None:
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    reference = engine.generate(ids, constrained("ar", schema, max_new))
    check_valid(tokenizer, reference, schema)
    engine.add_drafter("noise", GrammarNoiseDrafter(reference.token_ids, engine.vocab_size, seed, trees))
    assert engine.generate(ids, constrained("noise", schema, max_new, k)).token_ids == reference.token_ids


@pytest.mark.parametrize("method", ["hvd", "hvd-cache", "pld", "model"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, max_new=st.integers(1, 60))
def test_every_method_gives_constrained_ar(engine, tokenizer, method, schema, max_new) -> None:
    ids = tokenizer.encode("the city there", add_special_tokens=False)
    reference = engine.generate(ids, constrained("ar", schema, max_new))
    for _ in range(2):  # the second run drafts from the first's output (the cross-request store)
        result = engine.generate(ids, constrained(method, schema, max_new))
        assert result.token_ids == reference.token_ids
    check_valid(tokenizer, reference, schema)


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "n", "ok"],
          "properties": {"city": {"type": "string", "maxLength": 10}, "n": {"type": "integer"},
                         "ok": {"type": "boolean"}}}


def test_constrained_reply_validates_and_ends_by_itself(engine, tokenizer) -> None:
    result = engine.generate(tokenizer.encode("hello", add_special_tokens=False), constrained("hvd", SCHEMA, 200))
    assert result.finish_reason == "stop"
    jsonschema.validate(json.loads(result.text), SCHEMA)
    assert result.stats.grammar_s > 0


def test_batched_chunked_and_resumed_requests_give_constrained_ar(model, tokenizer, engine) -> None:
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in ("the city", "hello there", "abc abc")]
    reference = [engine.generate(p, constrained("ar", SCHEMA, 40)).token_ids for p in prompts]
    batched = Engine(model, tokenizer, eos_token_ids=engine.eos_token_ids, max_batch=4, prefill_chunk=3,
                     draft_head=None)
    results: dict[int, tuple[int, ...]] = {}

    def run(i: int, method: str) -> None:
        results[i] = batched.generate(prompts[i % 3], constrained(method, SCHEMA, 40)).token_ids

    threads = [threading.Thread(target=run, args=(i, m)) for i, m in enumerate(["hvd", "pld", "ar", "hvd-cache"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[i] for i in range(4)] == [reference[0], reference[1], reference[2], reference[0]]
    resumed = batched.generate(prompts[0], constrained("hvd", SCHEMA, 40))  # its prompt's KV from the prefix cache
    assert resumed.stats.reused_prefix_tokens > 0 and resumed.token_ids == reference[0]


def test_a_reply_cut_by_max_tokens_ends_with_length(engine, tokenizer) -> None:
    result = engine.generate(tokenizer.encode("hi", add_special_tokens=False), constrained("hvd", SCHEMA, 5))
    assert result.finish_reason == "length" and len(result.token_ids) == 5


def test_regex_lark_and_gbnf_constraints(engine, tokenizer) -> None:
    ids = tokenizer.encode("code:", add_special_tokens=False)
    regex = engine.generate(ids, GenerationParams(max_new_tokens=30, constraint=Constraint.regex(r"[a-c]{2}-[0-9]{3}")))
    assert regex.finish_reason == "stop" and len(regex.text) == 6 and regex.text[2] == "-"
    lark = engine.generate(ids, GenerationParams(max_new_tokens=30, constraint=Constraint.lark('start: "x" ("y" | "z")')))
    assert lark.text in ("xy", "xz")
    gbnf = engine.generate(ids, GenerationParams(max_new_tokens=30, constraint=Constraint.gbnf('root ::= "a" [0-9]')))
    assert gbnf.text[0] == "a" and gbnf.text[1].isdigit()


@pytest.mark.parametrize("constraint, message", [
    (Constraint.json_schema({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}),
     "unsupported keyword 'not' at /properties/a/not"),
    (Constraint.json_schema({"type": "string", "format": "uri-reference"}), "unsupported format 'uri-reference' at /format"),
    (Constraint.regex("a(b"), "unclosed group"),
    (Constraint.lark("start: foo"), "unknown name"),
])
def test_bad_constraints_are_refused_with_the_cause(engine, tokenizer, constraint, message) -> None:
    with pytest.raises(InvalidRequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        engine.generate([1, 2], GenerationParams(max_new_tokens=4, constraint=constraint))


def test_a_lenient_schema_ignores_what_it_cannot_enforce(engine, tokenizer) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "boolean", "not": {"const": True}}}, "required": ["a"],
              "additionalProperties": False}
    result = engine.generate([1, 2], GenerationParams(max_new_tokens=30, constraint=Constraint.json_schema(
        schema, strict=False)))
    assert result.finish_reason == "stop" and isinstance(json.loads(result.text)["a"], bool)


def shifted_one_late(original):
    """A planted bug: row i masked by the state of row i - 1 (the mask applied one position late)."""

    def allowed(self, draft):
        rows = original(self, draft)
        return np.concatenate([rows[:1], rows[:-1]]) if len(rows) > 1 else rows

    return allowed


def test_a_mask_applied_one_position_late_fails_the_equality(engine, tokenizer, monkeypatch) -> None:
    ids = tokenizer.encode("the city", add_special_tokens=False)
    reference = engine.generate(ids, constrained("ar", SCHEMA, 40)).token_ids
    monkeypatch.setattr(GrammarState, "allowed", shifted_one_late(GrammarState.allowed))
    mismatches = 0
    for seed in range(6):
        engine.add_drafter("noise", GrammarNoiseDrafter(reference, engine.vocab_size, seed))
        try:
            mismatches += engine.generate(ids, constrained("noise", SCHEMA, 40, 8)).token_ids != reference
        except RuntimeError:  # the grammar refused an emitted token: caught as well
            mismatches += 1
    assert mismatches > 0


# ---------------------------------------------------------------- sampling

REGEX = "[abc][abcd]"


class LetterQDrafter:
    """Samples each draft token from a fixed q over a few letters (plus some mass elsewhere) and reports q."""

    def __init__(self, tokenizer, seed: int) -> None:
        q = torch.full((len(tokenizer),), 1e-3, dtype=torch.float64)
        for letter, weight in zip("abcd", (0.4, 0.1, 0.3, 0.2)):
            q[tokenizer.convert_tokens_to_ids(letter)] = weight
        self.q, self.gen = q / q.sum(), torch.Generator().manual_seed(seed)

    def start(self, req_id, prompt_ids, structure=None) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        tokens = torch.multinomial(self.q, k, replacement=True, generator=self.gen)
        return Draft(tuple(tokens.tolist()), probs=self.q.expand(k, -1), source="q")

    def observe(self, outcome: DraftOutcome) -> None:
        pass

    def stop(self, req_id) -> None:
        pass


def exact_constrained(model, tokenizer, prompt: list[int], params: GenerationParams) -> dict[tuple[int, int], float]:
    """P(t1, t2) under ``[abc][abcd]``: the target's logits masked, then warped (temperature, top-k, top-p)."""
    letters = [tokenizer.convert_tokens_to_ids(c) for c in "abcd"]

    def probs(ids: list[int], allowed: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1:].clone()  # [1, vocab]
        mask = torch.ones_like(logits, dtype=torch.bool)
        mask[0, allowed] = False
        return target_probs(logits.masked_fill(mask, float("-inf")), params.sampling)[0]

    first = probs(prompt, letters[:3])
    return {(a, b): float(first[a] * probs([*prompt, a], letters)[b]) for a in letters[:3] for b in letters}


@pytest.mark.parametrize("method, temperature, top_k, top_p", [
    ("q", 1.0, 0, 1.0),  # drafts sampled from a q with mass on refused tokens: the first refused one is verified
    ("q", 0.7, 3, 0.9),  # masked, then warped: temperature, top-k and top-p together
    ("tree", 0.8, 0, 0.95),  # deterministic alternatives at the first and second token
])
def test_constrained_sampling_keeps_the_masked_distribution(tokenizer, method, temperature, top_k, top_p) -> None:
    model = make_tiny_llama(len(tokenizer), seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.05)  # flatten: every cell has real mass
    engine = Engine(model, tokenizer, eos_token_ids=(tokenizer.convert_tokens_to_ids(END),), draft_head=None)
    engine.add_drafter("q", LetterQDrafter(tokenizer, seed=5))
    a, b, c = (tokenizer.convert_tokens_to_ids(x) for x in "abc")
    engine.add_drafter("tree", _FixedTree((a, b, c, a), (-1, -1, 0, 1)))
    prompt = tokenizer.encode("xy", add_special_tokens=False)
    params = GenerationParams(max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p, method=method,
                              num_draft_tokens=3, constraint=Constraint.regex(REGEX))
    expected = exact_constrained(model, tokenizer, prompt, params)
    observed: Counter = Counter()
    n = 1000
    for i in range(n):
        run = GenerationParams(**{**params.__dict__, "seed": 1000 + i})
        observed[tuple(engine.generate(prompt, run).token_ids[:2])] += 1
    assert set(observed) <= set(expected)
    stat, df = chi_square(observed, expected, n)
    assert stat < chi_square_critical(df), f"chi2={stat:.1f} with df={df}"


class _FixedTree:
    def __init__(self, tokens, parents) -> None:
        self.tokens, self.parents = tokens, parents

    def start(self, req_id, prompt_ids, structure=None) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        return Draft(self.tokens, source="tree", parents=self.parents)

    def observe(self, outcome: DraftOutcome) -> None:
        pass

    def stop(self, req_id) -> None:
        pass


def test_the_grammars_forced_text_is_drafted_and_accepted(engine, tokenizer) -> None:
    schema = {"type": "object", "properties": {"there": {"enum": ["thin thread", "thermal"]},
                                               "city": {"type": "string", "maxLength": 4}},
              "required": ["there", "city"], "additionalProperties": False}
    ids = tokenizer.encode("abc", add_special_tokens=False)
    reference = engine.generate(ids, constrained("ar", schema, 60))
    result = engine.generate(ids, constrained("hvd-cache", schema, 60))
    assert result.token_ids == reference.token_ids
    grammar = result.stats.per_source["grammar"]
    assert grammar.drafted >= 10 and grammar.accepted >= 10  # '{"there": "th', 'ermal", "city": "' ...
    assert result.stats.steps < reference.stats.steps


class Recording:
    """A drafter that records what its observe is told."""

    def __init__(self) -> None:
        self.outcomes: list[DraftOutcome] = []

    def start(self, req_id, prompt_ids, structure=None) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        return Draft()

    def observe(self, outcome: DraftOutcome) -> None:
        self.outcomes.append(outcome)

    def stop(self, req_id) -> None:
        pass


def test_a_step_drafted_by_the_grammar_reaches_the_drafter_as_one_it_did_not_draft(engine, tokenizer) -> None:
    inner = Recording()
    engine.add_drafter("recording", inner)
    result = engine.generate(tokenizer.encode("abc", add_special_tokens=False), constrained("recording", SCHEMA, 60))
    assert result.stats.per_source["grammar"].accepted > 0
    assert all(not outcome.draft.token_ids and outcome.num_accepted == 0 for outcome in inner.outcomes)
    assert sum(len(outcome.new_token_ids) for outcome in inner.outcomes) == len(result.token_ids)


def test_a_request_without_stop_ids_ends_where_its_grammar_does(model, tokenizer) -> None:
    engine = Engine(model, tokenizer, eos_token_ids=(), draft_head=None)
    result = engine.generate(tokenizer.encode("abc", add_special_tokens=False),
                             GenerationParams(max_new_tokens=40, constraint=Constraint.regex("[ab]{2}")))
    assert result.finish_reason == "stop" and len(result.text) == 2
    assert result.token_ids[-1] == tokenizer.eos_token_id
