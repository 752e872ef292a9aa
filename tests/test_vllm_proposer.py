"""The vLLM proposer against a stand-in for vLLM's call (no vLLM needed): shapes and types as vLLM
0.32 passes them, state across steps and row moves, rejections, short contexts, prompt structure
registered by a client, the cross-request store, and pricing by the batch."""

from __future__ import annotations

import inspect
import json
from types import SimpleNamespace

import numpy as np
import pytest

from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy.cost import CostModel
from hvd_agents.structure import PromptStructure, SpanKind, TypedSpan
from hvd_agents.vllm import HVDProposer, ProposerSettings, StructureFeed, StructureFile
from tests.vllm_fake import FakeBatch, FakeRequest

K = 6


def _config(k: int = K, max_model_len: int = 256) -> SimpleNamespace:
    """The two fields of vLLM's VllmConfig the proposer reads."""
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len))


def _proposer(cost: float = 0.02, **kwargs) -> HVDProposer:
    return HVDProposer(_config(**kwargs), ProposerSettings(cost=CostModel.linear(cost)))


# A tool call the agent repeats: the target copies it from the prompt into its answer.
SPAN = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]


def _agent_request(req_id: str, offset: int = 0, chunk: int | None = None) -> FakeRequest:
    prompt = [1 + offset, 2, 3, *SPAN, 4, 5, 6, 7, 40, 41]  # the span, then its start again
    script = [*SPAN[2:], 9, 8, 40, 41, 42, 43, 44, 45, 46, 7]  # goes on copying it, then repeats it
    return FakeRequest(req_id, prompt, script, chunk=chunk)


def test_the_signature_is_the_one_vllm_calls() -> None:
    # gpu_model_runner.propose_draft_token_ids, method "custom_class" (vLLM 0.32):
    #   self.drafter.propose(sampled_token_ids, self.input_batch.num_tokens_no_spec,
    #                        self.input_batch.token_ids_cpu, slot_mappings=slot_mappings)
    parameters = list(inspect.signature(HVDProposer.propose).parameters)
    assert parameters == ["self", "sampled_token_ids", "num_tokens_no_spec", "token_ids_cpu", "slot_mappings"]
    assert callable(HVDProposer.load_model)  # the CPU runner calls it on any drafter


def test_copies_a_repeated_span_and_the_target_output_is_the_script() -> None:
    proposer = _proposer()
    batch = FakeBatch(proposer.propose, K)
    (done,) = batch.run([_agent_request("a")])
    assert done.output == done.script
    assert proposer.stats.accepted >= len(SPAN) - 2  # the copied span was drafted and accepted
    assert done.steps < len(done.script) - 1 - proposer.stats.accepted + 2  # fewer target steps than tokens
    assert proposer.stats.started == 1  # one sequence, followed from step to step


def test_each_call_gives_one_list_of_ints_per_row_at_most_k() -> None:
    proposer = _proposer()
    batch = FakeBatch(proposer.propose, K)  # the batch asserts types, lengths and k at every call
    batch.run([_agent_request("a"), _agent_request("b", offset=10), _agent_request("c", offset=20)])
    assert batch.calls > 3
    assert proposer.stats.started == 3


def test_sequences_follow_their_content_when_rows_move() -> None:
    proposer = _proposer()
    batch = FakeBatch(proposer.propose, K)
    for request in (_agent_request("a"), _agent_request("b", offset=10), _agent_request("c", offset=20)):
        batch.add(request)
    batch.step()
    batch.step()
    batch.swap(0, 2)  # the scheduler reorders rows
    batch.step()
    batch.remove(batch.rows[0])  # c leaves the batch; b stays in row 1, a moves out of the last row ...
    batch.step()
    assert proposer.stats.started == 3  # ... and no sequence was taken for a new one
    assert len(proposer.sequences.sequences) == 2
    drafts_before = proposer.stats.accepted
    while batch.rows:
        batch.step()
    assert proposer.stats.accepted > drafts_before


def test_a_rejected_draft_is_settled_and_the_next_draft_follows_the_target() -> None:
    # the context suggests 43 44 45 ... after "40 41 42", but the target departs from the copy at 43
    proposer = _proposer(cost=0.0)
    prompt = [1, 2, *SPAN, 3, 40, 41]
    script = [42, 99, 98, 97, 96, 95, 94]
    batch = FakeBatch(proposer.propose, K)
    batch.add(FakeRequest("r", prompt, script))
    first = batch.step()[0]
    assert first[:2] == [43, 44]  # copied from the span
    second = batch.step()[0]  # verifies: 43 rejected, the target's 99 appended
    assert batch.rows[0].output == [42, 99]
    assert 43 not in second[:1]  # the rejected tokens are not in the context the next draft continues
    tokens = batch.token_ids_cpu[0, : batch.num_tokens_no_spec[0]].tolist()
    assert tokens == [*prompt, 42, 99]
    while batch.rows and not batch.rows[0].done:
        batch.step()
    assert batch.rows[0].output == script


def test_short_and_empty_contexts_and_partial_prefills_do_not_fail() -> None:
    proposer = _proposer()
    tokens = np.zeros((4, 32), dtype=np.int32)
    lengths = np.zeros(4, dtype=np.int32)
    assert proposer.propose([], lengths, tokens) == []  # no rows
    assert proposer.propose([[], []], lengths, tokens) == [[], []]  # prefilling rows
    tokens[0, 0] = 7
    lengths[0] = 1
    assert proposer.propose([[7]], lengths, tokens) == [[]]  # a one-token context: nothing to copy
    tokens[0, 1] = 7
    lengths[0] = 2
    assert len(proposer.propose([[7]], lengths, tokens)[0]) <= K


def test_chunked_prefill_starts_the_sequence_once_its_prompt_is_in() -> None:
    proposer = _proposer()
    batch = FakeBatch(proposer.propose, K)
    (done,) = batch.run([_agent_request("a", chunk=5)])
    assert done.output == done.script
    assert proposer.stats.started == 1 and proposer.stats.accepted > 0


def test_no_draft_past_the_model_length() -> None:
    proposer = _proposer(max_model_len=12)
    tokens = np.zeros((1, 12), dtype=np.int32)
    tokens[0, :11] = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5]
    assert proposer.propose([[5]], np.array([11], dtype=np.int32), tokens) == [[]]


def test_a_context_shorter_than_its_sampled_tokens_is_refused() -> None:
    proposer = _proposer()
    with pytest.raises(ValueError, match="row 0 has 1 context tokens but sampled 2"):
        proposer.propose([[3, 4]], np.array([1], dtype=np.int32), np.zeros((1, 8), dtype=np.int32))


def test_twins_keep_one_state_each() -> None:
    # two rows with the same prompt (n > 1 samples of one request) are two sequences
    proposer = _proposer()
    batch = FakeBatch(proposer.propose, K)
    twins = [_agent_request("a"), _agent_request("b")]
    done = batch.run(twins)
    assert all(r.output == r.script for r in done)
    assert proposer.stats.started == 2


def test_a_finished_sequence_output_is_copied_by_a_later_request() -> None:
    # request 1 writes a span that is in no prompt; request 2 (another prompt) gets to its start
    proposer = _proposer(cost=0.0)
    batch = FakeBatch(proposer.propose, K)
    output = [60, 61, 62, 63, 64, 65, 66, 67, 68, 69]
    batch.run([FakeRequest("one", [1, 2, 3], output)])
    batch.run([FakeRequest("two", [9, 8, 7, 60, 61], [62, 63, 64, 65, 66, 67, 68, 69, 5])])
    assert proposer.stats.started == 2
    assert proposer.stats.accepted >= 5  # copied from request 1's output, kept in the store


def test_registered_tool_call_skeletons_are_drafted(tmp_path) -> None:
    path = tmp_path / "structure.jsonl"
    skeleton = (30, 31, 32, 33, 34, 35, 36)  # e.g. '<tool_call>{"name": "get_weather", ...' : in no prompt
    prompt = (1, 2, 3, 4)
    structure = PromptStructure(prompt, (TypedSpan(0, 4, SpanKind.SYSTEM),), "s1",
                                ((skeleton, SpanKind.TOOL_CALL_SKELETON),))
    StructureFile(path).register(structure)
    proposer = HVDProposer(_config(), ProposerSettings(cost=CostModel.linear(0.0), structure_file=path))
    batch = FakeBatch(proposer.propose, K)
    (done,) = batch.run([FakeRequest("r", list(prompt), [30, 31, 32, 33, 34, 35, 36, 2])])
    assert done.output == done.script
    assert proposer.stats.structures == 1
    assert proposer.stats.accepted >= 4


def test_the_feed_reads_only_complete_lines_and_skips_bad_ones(tmp_path, caplog) -> None:
    path = tmp_path / "structure.jsonl"
    feed = StructureFeed(path)
    assert feed.poll() == []  # no file yet
    StructureFile(path).register(PromptStructure((1, 2, 3)))
    with path.open("a") as handle:
        handle.write("not json\n")
        handle.write(json.dumps({"prompt_ids": [4, 5]})[:-3])  # a line still being written
    assert [s.prompt_ids for s in feed.poll()] == [(1, 2, 3)]
    assert "skipping unreadable structure line 2" in caplog.text
    assert feed.structure_of(np.array([1, 2, 3], dtype=np.int32)) is not None
    assert feed.structure_of(np.array([1, 2], dtype=np.int32)) is None


def test_dear_verification_drafts_less_than_cheap() -> None:
    # the same contexts, priced at c = 0 (free rows) and at c = 3 (a draft token dearer than a step)
    def drafted(cost: float) -> int:
        proposer = _proposer(cost=cost)
        batch = FakeBatch(proposer.propose, K)
        batch.run([_agent_request("a"), _agent_request("b", offset=10)])
        return proposer.stats.drafted

    assert drafted(0.0) > 0
    assert drafted(3.0) == 0


def test_settings_from_the_environment(tmp_path) -> None:
    assert ProposerSettings.from_env({}).cost.per_token == pytest.approx(0.02)
    assert ProposerSettings.from_env({"HVD_VLLM_VERIFY_COST": "0.3"}).cost.per_token == pytest.approx(0.3)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(CostModel(((0, 1.0), (8, 1.4))).to_dict()))
    assert ProposerSettings.from_env({"HVD_VLLM_VERIFY_COST": str(profile)}).cost.verify(8) == pytest.approx(1.4)
    settings = ProposerSettings.from_env({"HVD_VLLM_STRUCTURE": "/x/s.jsonl", "HVD_VLLM_STORE_TOKENS": "500"})
    assert str(settings.structure_file) == "/x/s.jsonl" and settings.store_tokens == 500
    with pytest.raises(InvalidRequestError, match="HVD_VLLM_VERIFY_COST"):
        ProposerSettings.from_env({"HVD_VLLM_VERIFY_COST": "cheap"})
    with pytest.raises(InvalidRequestError, match="HVD_VLLM_STORE_TOKENS"):
        ProposerSettings.from_env({"HVD_VLLM_STORE_TOKENS": "lots"})
    with pytest.raises(InvalidRequestError, match="num_speculative_tokens"):
        HVDProposer(SimpleNamespace(speculative_config=None, model_config=None))


def test_the_core_never_imports_vllm() -> None:
    from tests.test_layers import PACKAGE, imports_of, module_name

    found = [f"{path}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             for target, line in imports_of(path.read_text(encoding="utf-8"), module_name(path, PACKAGE),
                                            path.name == "__init__.py")
             if target == "vllm" or target.startswith("vllm.")]
    assert found == []


def test_an_unregistered_prompt_goes_to_the_store_when_its_sequence_leaves() -> None:
    # while the request runs its prompt is in its own context only (not twice, through the store);
    # once it has left, a later request with another prompt copies from it
    proposer = _proposer(cost=0.0)
    batch = FakeBatch(proposer.propose, K)
    batch.add(FakeRequest("one", [1, 2, 3, *SPAN], [5, 6, 7]))
    batch.step()
    assert len(proposer.store) == 0
    while batch.rows:
        batch.step()
    batch.step()  # the call after it left releases it
    assert len(proposer.store) > 0
    batch.run([FakeRequest("two", [9, 8, *SPAN[:2]], [*SPAN[2:], 4])])
    assert proposer.stats.accepted >= len(SPAN) - 4
