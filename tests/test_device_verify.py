"""A decode step reads the device once: verification runs on the logits' device and returns one packed tensor.

Every way a tensor's values reach the host from Python (``item``, ``tolist``, ``float()``,
``int()``, ``bool()``, ``__index__``, ``numpy``, ``cpu``) is counted while the engine
verifies, except inside the runner's forward (the model's own code is the runner's
business). Each step must make exactly one read, through ``Verification.from_packed``.

The engine here runs on the CPU, where a greedy step (and a sampled one with a deterministic draft) is verified
on host integers instead
(:func:`~hvd_agents.engine.request.verifies_on_host`); the read-once test turns that off, so it
checks the path a GPU takes, every step included.
"""

from __future__ import annotations

import pytest
import torch

from hvd_agents import Engine, GenerationParams
from hvd_agents.engine import request as request_module
from hvd_agents.engine.request import Request
from hvd_agents.engine.sampling import SamplingParams
from hvd_agents.engine.verify import Verification, verify_step
from tests.drafters_for_tests import RandomQDrafter, ScriptedDrafter, TreeDrafter
from tests.tiny import make_tiny_llama

VOCAB = 32
HOST_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "cpu")


class HostReads:
    """Counts host reads of tensor values while ``active`` and not ``paused``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.active = False
        self.paused = False
        self.reads: list[str] = []
        for name in HOST_READS:
            monkeypatch.setattr(torch.Tensor, name, self._counting(name, getattr(torch.Tensor, name)))

    def _counting(self, name, original):
        def read(tensor, *args, **kwargs):
            if self.active and not self.paused:
                self.reads.append(name)
            return original(tensor, *args, **kwargs)

        return read


class UncountedForward:
    """The engine's runner, with host reads inside ``forward`` not counted."""

    def __init__(self, runner, reads: HostReads) -> None:
        self._runner = runner
        self._reads = reads

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def forward(self, *args, **kwargs):
        self._reads.paused = True
        try:
            return self._runner.forward(*args, **kwargs)
        finally:
            self._reads.paused = False


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(make_tiny_llama(VOCAB), eos_token_ids=())


@pytest.mark.parametrize(
    "method, temperature",
    [("ar", 0.0), ("scripted", 0.0), ("tree", 0.0), ("tree", 1.0), ("q", 1.0), ("q", 0.0), ("scripted", 0.8)],
)
def test_one_host_read_per_step(engine: Engine, monkeypatch: pytest.MonkeyPatch, method, temperature) -> None:
    prompt = [3, 17, 12, 5, 9, 3, 17]
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=16, method="ar")).token_ids
    drafters = {
        "scripted": ScriptedDrafter(reference, VOCAB, seed=1),
        "tree": TreeDrafter(reference, VOCAB, seed=2, uses_hidden_states=True),
        "q": RandomQDrafter(VOCAB, seed=3),
    }
    if method in drafters:
        engine.add_drafter(method, drafters[method])
    reads = HostReads(monkeypatch)
    monkeypatch.setattr(engine, "runner", UncountedForward(engine.runner, reads))
    per_step: list[list[str]] = []
    decoded: list[int] = []
    original_verify = Request.verify
    original_from_packed = Verification.from_packed.__func__

    def counted_verify(req, draft):
        reads.active, reads.reads = True, []
        try:
            return original_verify(req, draft)
        finally:
            reads.active = False
            per_step.append(reads.reads)

    def counted_from_packed(cls, values):
        decoded.append(len(values))
        return original_from_packed(cls, values)

    monkeypatch.setattr(Request, "verify", counted_verify)
    monkeypatch.setattr(Verification, "from_packed", classmethod(counted_from_packed))
    monkeypatch.setattr(request_module, "verifies_on_host", lambda *step: False)  # the device path
    params = GenerationParams(max_new_tokens=16, method=method, num_draft_tokens=6, temperature=temperature,
                              seed=5, reuse_prefix=False)
    result = engine.generate(prompt, params)
    assert result.stats.steps == len(per_step) == len(decoded) > 0
    assert per_step == [["tolist"]] * len(per_step), per_step
    if temperature == 0.0:
        assert result.token_ids == reference
    if method != "ar":
        assert result.stats.drafted_tokens > 0


def test_the_counter_sees_a_second_read(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: one extra ``.item()`` in the step is caught."""
    reads = HostReads(monkeypatch)
    reads.active = True
    packed = verify_step(torch.zeros(2, VOCAB), torch.tensor([1]), torch.tensor([-1]), SamplingParams())
    assert reads.reads == []
    Verification.from_packed(packed.tolist())
    int(packed[0].item())
    assert reads.reads == ["tolist", "item"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_verify_step_does_not_synchronise_on_cuda() -> None:
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(5, 1000, device=device)
    ids = torch.tensor([4, 7, 4, 9], device=device)
    tree = torch.tensor([-1, 0, -1, 2], device=device)
    chain = torch.arange(-1, 3, device=device)
    q = torch.softmax(torch.randn(4, 1000, device=device), dim=-1)
    warped = SamplingParams(temperature=0.7, top_k=50, top_p=0.9)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        packs = [
            verify_step(logits, ids, tree, SamplingParams()),
            verify_step(logits, ids, chain, SamplingParams()),
            verify_step(logits, ids, tree, warped, gen),
            verify_step(logits, ids, chain, warped, gen, q),
        ]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for packed in packs:
        result = Verification.from_packed(packed.tolist())
        assert len(result.token_ids) == result.num_accepted + 1


@pytest.mark.parametrize("method, temperature", [("ar", 0.0), ("ar", 0.8), ("tree", 1.0), ("q", 1.0), ("q", 0.0)])
def test_a_cpu_step_is_verified_on_host_integers(engine: Engine, monkeypatch: pytest.MonkeyPatch,
                                                 method, temperature) -> None:
    # on the CPU no step goes through the packed tensor: greedy or sampled, a chain, a tree or a draft with q
    prompt = [3, 17, 12, 5, 9, 3, 17]
    reference = engine.generate(prompt, GenerationParams(max_new_tokens=16, method="ar")).token_ids
    drafters = {"tree": TreeDrafter(reference, VOCAB, seed=2, uses_hidden_states=True), "q": RandomQDrafter(VOCAB, seed=3)}
    if method in drafters:
        engine.add_drafter(method, drafters[method])
    decoded: list[int] = []
    original_from_packed = Verification.from_packed.__func__

    def counted_from_packed(cls, values):
        decoded.append(len(values))
        return original_from_packed(cls, values)

    monkeypatch.setattr(Verification, "from_packed", classmethod(counted_from_packed))
    result = engine.generate(prompt, GenerationParams(max_new_tokens=8, method=method, num_draft_tokens=4,
                                                      temperature=temperature, seed=1, reuse_prefix=False))
    assert result.stats.steps > 0 and decoded == []
    if method != "ar":
        assert result.stats.drafted_tokens > 0
