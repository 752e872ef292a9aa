"""Continuous batching (``Engine(max_batch=N)``): concurrent requests decoded together.

Every request's greedy output in a batch equals its output alone, token for token, under
every built-in method and adversarial drafts; seeded sampling keeps each request's
distribution; closing a stream ends its request within a step; errors reach their own
request only. On the native CPU runner (one forward for all rows) and on the HF runner
(separate forwards), tiny models.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hvd_agents import Engine, GenerationParams
from hvd_agents.drafters import Draft
from hvd_agents.engine.batch import allocate
from hvd_agents.errors import ContextLengthError, InvalidRequestError
from hvd_agents.policy import CostModel
from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu import weights as quant_weights
from hvd_agents.runtime.cpu.runner import NativeModel, QuantRunner
from hvd_agents.runtime.target import Target
from tests.drafters_for_tests import FixedDrafter, ScriptedDrafter, TreeDrafter
from tests.test_engine_lossless import SMALL_VOCAB, chi_square, chi_square_critical, exact_two_token_distribution
from tests.tiny import make_tiny_llama

VOCAB = 96


def quant_model() -> NativeModel:
    model = make_tiny_llama(VOCAB, seed=0, dtype=torch.float32)
    return NativeModel(model, quant_weights.from_model(model, "int8"), 512)


RUNNERS = ["native", "hf"] if native_forward.available() else ["hf"]


@pytest.fixture(scope="module", params=RUNNERS)
def engines(request):
    """(serial engine, batched engine) over one model."""
    native = quant_model() if request.param == "native" else None
    model = native.model if native is not None else make_tiny_llama(VOCAB, seed=1)
    cost = CostModel.linear(0.1)  # a fixed profile: nothing to measure in the tests
    serial = Engine(Target.of(model, eos_token_ids=(), cost_model=cost, native=native), draft_head=None)
    batched = Engine(Target.of(model, eos_token_ids=(), cost_model=cost, native=native), draft_head=None, max_batch=6)
    if request.param == "native":
        assert isinstance(batched.runner, QuantRunner)
    return serial, batched


def run_concurrently(fn, jobs, workers: int = 12) -> list:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda job: fn(*job), jobs))


def test_every_request_in_a_batch_gets_its_output_alone(engines) -> None:
    serial, batched = engines
    rng = random.Random(0)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(2, 30))] * 2 for _ in range(8)]
    jobs = [(p, method, rng.randint(1, 40)) for p in prompts for method in ("ar", "pld", "hvd-cache", "hvd")]

    def generate(engine, prompt, method, n):
        return engine.generate(prompt, GenerationParams(max_new_tokens=n, method=method))

    alone = [generate(serial, *job) for job in jobs]
    together = run_concurrently(lambda *job: generate(batched, *job), jobs)
    for a, b in zip(alone, together):
        assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
        assert b.stats.new_tokens == len(b.token_ids)
    assert batched.batcher.largest_batch > 1 and batched.batcher.steps > 0


def test_adversarial_chain_and_tree_drafts_in_a_batch(engines) -> None:
    serial, batched = engines
    prompt = [3, 17, 42, 5, 9, 3, 17]
    reference = serial.generate(prompt, GenerationParams(max_new_tokens=40, method="ar")).token_ids
    batched.add_drafter("scripted", ScriptedDrafter(reference, VOCAB, seed=1))
    batched.add_drafter("tree", TreeDrafter(reference, VOCAB, seed=2))
    jobs = [(method, k) for method in ("scripted", "tree") for k in (1, 4, 12)] * 2
    got = run_concurrently(lambda method, k: batched.generate(
        prompt, GenerationParams(max_new_tokens=40, method=method, num_draft_tokens=k)).token_ids, jobs)
    assert all(tokens == reference for tokens in got)


def test_seeded_sampling_in_a_batch_keeps_the_targets_distribution() -> None:
    model = make_tiny_llama(SMALL_VOCAB, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.15)  # flatten: many cells with real mass
    engine = Engine(model, eos_token_ids=(), draft_head=None, max_batch=8)
    engine.add_drafter("fixed", FixedDrafter([2, 2, 5]))
    prompt = [1, 4, 2, 7, 1, 4]
    params = GenerationParams(max_new_tokens=2, temperature=0.9, method="fixed", num_draft_tokens=3)
    n = 1500
    runs = run_concurrently(lambda i: engine.generate(prompt, GenerationParams(**{**params.__dict__, "seed": i})),
                            [(i,) for i in range(n)], workers=16)
    observed = Counter(tuple(run.token_ids[:2]) for run in runs)
    stat, df = chi_square(observed, exact_two_token_distribution(model, prompt, params), n)
    assert stat < chi_square_critical(df), f"chi2={stat:.1f} with df={df}"
    again = engine.generate(prompt, GenerationParams(**{**params.__dict__, "seed": 7})).token_ids
    assert again == runs[7].token_ids  # a seed reproduces its sample, whatever shared its steps


def test_closing_a_stream_ends_its_request_within_a_step(engines) -> None:
    serial, batched = engines
    prompt = [5, 6, 7, 8] * 4
    reference = serial.generate(prompt, GenerationParams(max_new_tokens=60, method="ar")).token_ids
    drafter = ScriptedDrafter(reference, VOCAB, seed=3)
    batched.add_drafter("watched", drafter)
    stream = batched.stream(prompt, GenerationParams(max_new_tokens=400, method="watched", reuse_prefix=False))
    next(stream)
    stream.close()
    deadline = time.monotonic() + 10
    while not drafter.stopped and time.monotonic() < deadline:
        time.sleep(0.01)
    assert drafter.stopped, "the closed request's drafter was not stopped"
    # the batch goes on: the next request is answered, and correctly
    assert batched.generate(prompt, GenerationParams(max_new_tokens=60, method="ar")).token_ids == reference
    never_read = batched.stream(prompt, GenerationParams(max_new_tokens=400, method="watched"))
    del never_read  # dropped before its first item: cancelled too, started or not
    deadline = time.monotonic() + 10
    while batched.batcher.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batched.batcher.pending == 0


def test_errors_reach_their_own_request_only(engines) -> None:
    _, batched = engines
    with pytest.raises(InvalidRequestError, match="prompt_ids is empty"):
        batched.stream([], GenerationParams())
    with pytest.raises(ContextLengthError, match="context window is 512"):
        batched.stream([1] * 600, GenerationParams())

    class Broken:
        def start(self, *args) -> None:
            raise RuntimeError("broken drafter")

        def propose(self, ctx, k):
            return Draft()

        def observe(self, outcome) -> None:
            pass

        def stop(self, req_id) -> None:
            pass

    batched.add_drafter("broken", Broken())
    results = {}

    def run(name, method):
        try:
            results[name] = batched.generate([1, 2, 3], GenerationParams(max_new_tokens=8, method=method)).token_ids
        except RuntimeError as exc:
            results[name] = exc

    threads = [threading.Thread(target=run, args=(f"{m}{i}", m)) for i in range(3) for m in ("broken", "ar")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(isinstance(results[f"broken{i}"], RuntimeError) for i in range(3))
    assert all(len(results[f"ar{i}"]) == 8 for i in range(3))


def test_prefix_reuse_works_across_batched_turns(engines) -> None:
    _, batched = engines
    turn = [11, 12, 13, 14, 15, 16] * 5
    first = batched.generate(turn, GenerationParams(max_new_tokens=10, method="hvd"))
    second = batched.generate(turn + list(first.token_ids) + [20, 21], GenerationParams(max_new_tokens=10))
    assert second.stats.reused_prefix_tokens >= len(turn)


def test_allocation_keeps_every_root_and_the_likeliest_draft_tokens() -> None:
    drafts = [Draft((1, 2, 3, 4)), Draft((5, 6)), Draft((7,)), Draft((8, 9, 10), parents=(-1, -1, 0))]
    rates = [0.9, 0.2, 0.5, 0.8]
    for rows in (4, 5, 8, 12, 64):
        cut = allocate(drafts, rates, rows)
        assert sum(1 + len(d) for d in cut) <= max(rows, 4)
        assert all(a.token_ids[: len(b)] == b.token_ids for a, b in zip(drafts, cut) if not a.is_tree)
    assert [len(d) for d in allocate(drafts, rates, 4)] == [0, 0, 0, 0]  # roots only
    assert [len(d) for d in allocate(drafts, rates, 7)] == [2, 0, 0, 1]  # 0.9, 0.81 > 0.8 > 0.729...
    assert allocate(drafts, rates, 64) == drafts
    with pytest.raises(InvalidRequestError, match="max_batch must be in 1..64"):
        Engine(make_tiny_llama(VOCAB), eos_token_ids=(), max_batch=100)


def test_allocation_spends_rows_where_expected_tokens_pay_for_their_cost() -> None:
    sure = Draft((1, 2, 3, 4), survival=(0.99, 0.98, 0.97, 0.2))  # the drafter's own estimate, before verifying
    doubtful = Draft((5, 6, 7))
    rates = [0.1, 0.3]  # the first request's running rate is low, but its drafter is sure of this draft
    free, costly = CostModel.linear(0.0), CostModel.linear(0.5)
    assert [len(d) for d in allocate([sure, doubtful], rates, 64, free)] == [4, 3]  # free rows: verify everything
    # each row costs half a step: 2 roots (2 tokens, cost 1.5) gain 0.99, 0.98, 0.97 for 0.5 each, nothing more
    assert [len(d) for d in allocate([sure, doubtful], rates, 64, costly)] == [3, 0]
    assert [len(d) for d in allocate([sure, doubtful], rates, 64, CostModel.linear(5.0))] == [0, 0]
    # a measured step function: rows up to 8 cost one step, then a jump; the cut lands before the jump
    step = CostModel(((0, 1.0), (7, 1.0), (8, 3.0), (40, 4.0)))
    cut = allocate([sure, doubtful, Draft((8, 9, 10, 11))], [0.1, 0.3, 0.9], 64, step)
    assert sum(1 + len(d) for d in cut) == 8
    # a sampled request's draft is kept whole (its random numbers follow its drafts, never its company)
    kept = allocate([sure, doubtful], rates, 64, CostModel.linear(5.0), keep_whole=[False, True])
    assert kept[1] is doubtful and [len(d) for d in kept] == [3, 3]  # its rows make the step dear: sure tokens pay
    assert Draft((1, 2), survival=(0.9, 0.8, 0.7)).survival == (0.9, 0.8)  # one estimate per main-branch token at most
    assert sure.truncated(2).survival == (0.99, 0.98)


def test_a_batching_server_answers_concurrent_requests_as_one_at_a_time(tiny_model, byte_tokenizer) -> None:
    openai = pytest.importorskip("openai")
    from tests.server_helpers import IM_END_ID, running_server

    serial = Engine(tiny_model, byte_tokenizer, eos_token_ids=(IM_END_ID,))
    batched = Engine(tiny_model, byte_tokenizer, eos_token_ids=(IM_END_ID,), max_batch=4)
    questions = [f"Name {n} primes and {n} squares." for n in range(8)]

    def expected(q: str) -> str:
        from langchain_hvd import ChatHVD

        return ChatHVD(engine=serial, max_tokens=16).invoke([("human", q)]).content

    with running_server(batched, max_batch=4) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

        def ask(q: str) -> str:
            reply = client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=16,
                                                   messages=[{"role": "user", "content": q}])
            return reply.choices[0].message.content

        got = run_concurrently(ask, [(q,) for q in questions], workers=8)
    assert got == [expected(q) for q in questions]
    assert batched.batcher.largest_batch > 1
