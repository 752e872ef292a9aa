"""Fairness and bounds of an engine: chunked prefill, per-request deadlines, a bounded queue.

* A prompt longer than ``prefill_chunk`` is prefilled in chunks, the same ones alone and
  batched (outputs equal token for token), and a batching engine runs the chunks of a
  joining request between the steps of the requests already decoding.
* ``timeout_s`` ends a request with ``RequestTimeoutError`` naming where it was: waiting
  for the engine or for a place in the batch, or decoding; the others are unaffected and
  its slot is freed.
* ``max_queue`` bounds what waits for a batch: one more raises ``QueueFullError``.
Tiny models; a slow runner wrapper makes the deadlines certain, never a timing assertion.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from hvd_agents import Engine, GenerationParams, QueueFullError, RequestTimeoutError
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy import CostModel
from hvd_agents.runtime.target import Target
from tests.test_batch import RUNNERS, VOCAB, quant_model, run_concurrently
from tests.tiny import make_tiny_llama

COST = CostModel.linear(0.1)


class LoggingRunner:
    """A runner that logs each call as ("prefill", tokens), ("forward", tokens) or ("step", requests); maybe slowed."""

    def __init__(self, runner, delay_s: float = 0.0) -> None:
        self._runner = runner
        self.delay_s = delay_s
        self.log: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def forward(self, kv, token_ids, **kwargs):
        self.log.append(("prefill" if kwargs.get("logits_to_keep") == 1 else "forward", len(token_ids)))
        time.sleep(self.delay_s)
        return self._runner.forward(kv, token_ids, **kwargs)

    def forward_batch(self, calls):
        self.log.append(("step", len(calls)))
        time.sleep(self.delay_s)
        return self._runner.forward_batch(calls)


def _model(kind: str):
    """(model, its native forward or None)."""
    if kind == "native":
        native = quant_model()
        return native.model, native
    return make_tiny_llama(VOCAB, seed=1), None


@pytest.fixture(scope="module", params=RUNNERS)
def model(request):
    return _model(request.param)


def _engine(model, delay_s: float = 0.0, **kwargs) -> tuple[Engine, LoggingRunner]:
    model, native = model
    base = Engine(Target.of(model, eos_token_ids=(), cost_model=COST, native=native), draft_head=None)
    runner = LoggingRunner(base.runner, delay_s)
    return Engine(model, eos_token_ids=(), draft_head=None, cost_model=COST, runner=runner, **kwargs), runner


# ---------------------------------------------------------------- chunked prefill


def test_long_prompts_are_prefilled_in_chunks_with_the_same_output_alone_and_batched(model) -> None:
    serial, serial_log = _engine(model, prefill_chunk=16)
    batched, _ = _engine(model, prefill_chunk=16, max_batch=4)
    rng = random.Random(3)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(5, 70))] for _ in range(6)]
    jobs = [(p, method) for p in prompts for method in ("ar", "hvd")]

    def generate(engine, prompt, method):
        return engine.generate(prompt, GenerationParams(max_new_tokens=12, method=method, reuse_prefix=False))

    alone = [generate(serial, *job) for job in jobs]
    together = run_concurrently(lambda *job: generate(batched, *job), jobs)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    prefills = [n for kind, n in serial_log.log if kind == "prefill"]
    assert max(prefills) <= 16 and sum(prefills) == sum(len(p) - 1 for p, _ in jobs)  # every prompt, in chunks
    assert len(prefills) > len(jobs)  # some prompts took several chunks
    assert all(r.stats.prefilled_tokens == len(p) - 1 for r, (p, _) in zip(alone, jobs))


def test_a_long_prompt_joining_the_batch_is_prefilled_between_the_others_steps(model) -> None:
    engine, runner = _engine(model, delay_s=0.005, prefill_chunk=8, max_batch=4)
    first = engine.stream([1, 2, 3], GenerationParams(max_new_tokens=200, method="ar"))
    next(first)  # the first request is decoding
    runner.log.clear()
    long_prompt = [random.Random(0).randrange(VOCAB) for _ in range(60)]  # 59 tokens to prefill: 8 chunks
    second = engine.generate(long_prompt, GenerationParams(max_new_tokens=3, method="ar"))
    rest = list(first)
    chunks = [i for i, (kind, n) in enumerate(runner.log) if kind == "prefill"]
    assert [runner.log[i][1] for i in chunks] == [8, 8, 8, 7, 7, 7, 7, 7]  # even_chunks of the 59 tokens
    steps_between = [i for i, (kind, _) in enumerate(runner.log) if kind == "step" and chunks[0] < i < chunks[-1]]
    assert len(steps_between) >= 4  # a step of the first request after every chunk's worth (8 tokens) of prefill
    assert second.stats.prefilled_tokens == 59 and rest[-1].finish_reason == "length"


# ---------------------------------------------------------------- deadlines


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), float("inf"), "soon", True])
def test_a_bad_timeout_is_refused(timeout) -> None:
    with pytest.raises(InvalidRequestError, match="timeout_s must be a finite number of seconds > 0 or None"):
        GenerationParams(timeout_s=timeout)


def test_a_serial_request_past_its_deadline_while_decoding(model) -> None:
    engine, _ = _engine(model, delay_s=0.02)
    events: list = []
    with pytest.raises(RequestTimeoutError, match=r"ran past its timeout of 0.2 s while decoding \(\d+ tokens"):
        events.extend(engine.stream([1, 2, 3], GenerationParams(max_new_tokens=500, method="ar", timeout_s=0.2)))
    assert events and not engine._lock.locked()
    after = engine.generate([1, 2, 3], GenerationParams(max_new_tokens=4, method="ar"))  # the engine still serves
    assert after.token_ids[:1] == events[0].token_ids[:1] and after.stats.reused_prefix_tokens > 0  # its KV was kept


def test_a_serial_request_that_waits_for_the_engine_past_its_deadline(model) -> None:
    engine, _ = _engine(model)
    holder = engine.stream([1, 2, 3], GenerationParams(max_new_tokens=10, method="ar"))
    next(holder)  # holds the engine while suspended
    with pytest.raises(RequestTimeoutError, match="waiting for the engine"):
        engine.generate([4, 5], GenerationParams(max_new_tokens=2, timeout_s=0.1))
    holder.close()
    assert engine.generate([4, 5], GenerationParams(max_new_tokens=2, timeout_s=30)).finish_reason == "length"


def test_batched_deadlines_end_only_their_own_request_and_free_its_place(model) -> None:
    engine, _ = _engine(model, delay_s=0.02, max_batch=2)
    results: dict[str, object] = {}

    def run(name: str, params: GenerationParams) -> None:
        try:
            results[name] = engine.generate([1, 2, 3, 4], params)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            results[name] = exc

    jobs = {
        "long": GenerationParams(max_new_tokens=60, method="ar"),
        "decoding": GenerationParams(max_new_tokens=500, method="ar", timeout_s=0.3),
        "queued": GenerationParams(max_new_tokens=5, method="ar", timeout_s=0.1),  # no place before its deadline
    }
    threads = []
    for name, params in jobs.items():
        threads.append(threading.Thread(target=run, args=(name, params)))
        threads[-1].start()
        time.sleep(0.05)  # in this order: the first two take the batch's places
    for t in threads:
        t.join(timeout=60)
    assert isinstance(results["decoding"], RequestTimeoutError) and "while decoding" in str(results["decoding"])
    assert isinstance(results["queued"], RequestTimeoutError)
    assert "waiting for a place in the batch (0 tokens generated)" in str(results["queued"])
    assert results["long"].finish_reason == "length" and len(results["long"].token_ids) == 60
    assert _drained(engine)
    assert engine.generate([1, 2, 3, 4], GenerationParams(max_new_tokens=3, method="ar")).finish_reason == "length"


def _drained(engine: Engine) -> bool:
    """Whether the batch empties (its worker updates it just after delivering the last event)."""
    for _ in range(500):
        if engine.batcher.pending == 0:
            return True
        time.sleep(0.01)
    return False


# ---------------------------------------------------------------- the queue's bound


def test_a_full_queue_refuses_the_next_request_and_frees_with_the_batch(model) -> None:
    engine, _ = _engine(model, delay_s=0.01, max_batch=2, max_queue=1)
    streams = [engine.stream([1, 2, 3 + i], GenerationParams(max_new_tokens=30, method="ar")) for i in range(3)]
    with pytest.raises(QueueFullError, match=r"1 requests are already waiting .*\(max_queue=1\)"):
        engine.stream([9, 9], GenerationParams(max_new_tokens=3, method="ar"))
    outputs = [list(s) for s in streams]
    assert all(o[-1].finish_reason == "length" for o in outputs)
    assert engine.generate([9, 9], GenerationParams(max_new_tokens=3, method="ar")).finish_reason == "length"


@pytest.mark.parametrize("max_queue", [-1, 1.5, "many"])
def test_a_bad_max_queue_is_refused(max_queue) -> None:
    with pytest.raises(InvalidRequestError, match="max_queue must be an int >= 0 or None"):
        Engine(make_tiny_llama(VOCAB, seed=1), eos_token_ids=(), draft_head=None, cost_model=COST, max_batch=2,
               max_queue=max_queue)


def test_a_bad_prefill_chunk_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="prefill_chunk must be an int >= 1"):
        Engine(make_tiny_llama(VOCAB, seed=1), eos_token_ids=(), draft_head=None, cost_model=COST, prefill_chunk=0)



# ---------------------------------------------------------------- through the adapters


@pytest.mark.parametrize("max_batch", [1, 4])
def test_the_adapters_timeout_raises_request_timeout_error(tiny_model, byte_tokenizer, max_batch) -> None:
    import asyncio

    from langchain_hvd import ChatHVD
    from llama_index.llms.hvd import HVD

    base = Engine(tiny_model, byte_tokenizer, eos_token_ids=(), draft_head=None, cost_model=COST)
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=(), draft_head=None, cost_model=COST,
                    runner=LoggingRunner(base.runner, delay_s=0.02), max_batch=max_batch)
    llm = ChatHVD(engine=engine, max_tokens=400, method="ar", timeout=0.2)
    with pytest.raises(RequestTimeoutError, match="ran past its timeout of 0.2 s"):
        llm.invoke("hi")
    with pytest.raises(RequestTimeoutError, match="ran past its timeout of 0.3 s"):
        asyncio.run(llm.ainvoke("hi", timeout=0.3))  # a call's own timeout overrides the model's
    with pytest.raises(RequestTimeoutError, match="ran past its timeout of 0.2 s"):
        HVD(engine=engine, max_tokens=400, method="ar", timeout=0.2).complete("hi")
    reply = ChatHVD(engine=engine, max_tokens=3, method="ar", timeout=30).invoke("hi")  # the engine still serves
    assert reply.usage_metadata["output_tokens"] == 3


def test_the_server_answers_504_past_its_request_timeout(tiny_model, byte_tokenizer) -> None:
    import httpx

    from tests.server_helpers import running_server

    base = Engine(tiny_model, byte_tokenizer, eos_token_ids=(), draft_head=None, cost_model=COST)
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=(), draft_head=None, cost_model=COST,
                    runner=LoggingRunner(base.runner, delay_s=0.02))
    body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "method": "ar"}
    with running_server(engine, request_timeout_s=0.3) as url:
        late = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 400}, timeout=30)
        on_time = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 2}, timeout=30)
    assert late.status_code == 504 and late.json()["error"]["code"] == "timeout"
    assert "ran past its timeout of 0.3 s" in late.json()["error"]["message"]
    assert on_time.status_code == 200


def test_concurrent_requests_share_a_prompt_prefix_prefilled_once(model) -> None:
    batched, log = _engine(model, delay_s=0.01, max_batch=4)
    serial, _ = _engine(model)
    shared = [random.Random(5).randrange(VOCAB) for _ in range(40)]  # a system prompt and tool schemas
    prompts = [shared + [i, i + 1, i + 2] for i in range(4)]
    params = GenerationParams(max_new_tokens=20, method="hvd")
    together: dict[int, object] = {}

    def run(i: int) -> None:
        together[i] = batched.generate(prompts[i], params)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.005)  # all in flight at once, arriving in order
    for t in threads:
        t.join(timeout=60)
    alone = [serial.generate(p, params) for p in prompts]
    assert [together[i].token_ids for i in range(4)] == [r.token_ids for r in alone]
    assert sorted(together[i].stats.reused_prefix_tokens for i in range(4)) == [0, 40, 40, 40]  # computed once
    prefilled = [n for kind, n in log.log if kind == "prefill"]
    assert sorted(prefilled) == [2, 2, 2, 42]


# ---------------------------------------------------------------- cancellation within a step


def test_a_cancelled_async_stream_leaves_the_batch_at_the_end_of_the_step_in_progress(tiny_model,
                                                                                       byte_tokenizer) -> None:
    import asyncio

    from langchain_hvd import ChatHVD

    base = Engine(tiny_model, byte_tokenizer, eos_token_ids=(), draft_head=None, cost_model=COST)
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=(), draft_head=None, cost_model=COST,
                    runner=LoggingRunner(base.runner, delay_s=0.05), max_batch=4)
    llm = ChatHVD(engine=engine, max_tokens=400, method="ar")
    batcher = engine.batcher

    async def scenario() -> tuple[int, int]:
        first = asyncio.Event()

        async def read() -> None:
            async for _ in llm.astream("hi"):
                first.set()

        task = asyncio.create_task(read())
        await first.wait()
        await asyncio.sleep(0.075)  # into a step
        at_cancel = batcher.steps
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while batcher.pending:
            await asyncio.sleep(0.005)
        return at_cancel, batcher.steps

    at_cancel, after = asyncio.run(scenario())
    assert after - at_cancel <= 1  # the step in progress, not the one after the worker's next event
