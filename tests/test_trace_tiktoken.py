"""The tiktoken adapter on an in-process byte-level encoding (no download): offsets, analyzer, replay."""

from __future__ import annotations

import pytest

tiktoken = pytest.importorskip("tiktoken")

from hvd_agents.chat.analyzer import analyze
from hvd_agents.errors import HVDError
from hvd_agents.runtime.loading import load_tokenizer
from hvd_agents.runtime.tiktoken_tokenizer import TiktokenTokenizer
from hvd_agents.structure import SpanKind
from hvd_agents.trace.loader import load_trace
from hvd_agents.trace.replay import ReplayConfig, replay_trace, reply_tokens
from tests.trace_data import conversations, copy_conversation, write_jsonl

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@pytest.fixture(scope="module")
def tok() -> TiktokenTokenizer:
    ranks = {bytes([b]): b for b in range(256)}
    for merge in (b"th", b"he", b"the", b" t", b"in", b"er", b"\xc3\xa9"):  # the last one is "é"
        ranks[merge] = len(ranks)
    encoding = tiktoken.Encoding("tiny", pat_str=PATTERN, mergeable_ranks=ranks,
                                 special_tokens={"<|endoftext|>": len(ranks)})
    return TiktokenTokenizer(encoding)


def test_call_offsets_and_decode(tok) -> None:
    text = "the théâtre ✓ <|endoftext|> end"
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc.input_ids == enc["input_ids"] and len(enc["offset_mapping"]) == len(enc.input_ids)
    assert tok.decode(enc.input_ids) == text
    starts = [start for start, _ in enc["offset_mapping"]]
    assert starts == sorted(starts) and starts[0] == 0
    for (start, end), token in zip(enc["offset_mapping"], enc.input_ids):
        piece = tok.decode([token])
        if "\ufffd" not in piece:  # whole characters: the offsets cover exactly this token's text
            assert text[start:end] == piece
    assert tok.convert_tokens_to_ids("<|endoftext|>") == tok.encoding.n_vocab - 1
    assert tok.convert_tokens_to_ids("<|im_end|>") is None
    assert tok.decode(enc.input_ids, skip_special_tokens=True) == text.replace("<|endoftext|>", "")
    assert tok.chat_template is None and tok.is_fast


def test_analyzer_types_spans_with_tiktoken_offsets(tok) -> None:
    conv = copy_conversation("f1")
    structure = analyze(tok, conv["messages"][:4], conv["tools"], session_id="f1")
    kinds = {span.kind for span in structure.spans}
    assert {SpanKind.SYSTEM, SpanKind.TOOL_SCHEMA, SpanKind.USER, SpanKind.TOOL_OUTPUT} <= kinds
    assert structure.spans[0].start == 0 and structure.spans[-1].end == len(structure.prompt_ids)


def test_replay_with_tiktoken(tok, tmp_path) -> None:
    conv = copy_conversation("f1")
    ids = reply_tokens(tok, conv["messages"], conv["tools"], 4)
    assert tok.decode(ids).startswith("The file says: ")  # no <|im_end|> token in this encoding
    trace = load_trace(write_jsonl(tmp_path / "t.jsonl", conversations()))
    result = replay_trace(tok, trace, ReplayConfig(("ar", "suffix")), progress=False)
    assert result.stats["ar"].output_tokens == result.stats["suffix"].output_tokens > 0
    assert result.stats["suffix"].steps < result.stats["ar"].steps


def test_unknown_tiktoken_encoding_is_an_hvd_error() -> None:
    with pytest.raises(HVDError, match="unknown tiktoken encoding 'nope'"):
        load_tokenizer("tiktoken:nope")
