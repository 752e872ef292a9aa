"""Both chat reply pipelines (the adapters' pieces, the server's deltas) start decoding the same way."""

from __future__ import annotations

import pytest

from hvd_agents import Engine
from hvd_agents.chat.async_stream import CancelFlag
from hvd_agents.chat.delta_stream import stream_reply_deltas
from hvd_agents.chat.request import ChatSettings, build_chat_request, stream_reply
from hvd_agents.engine import batch
from hvd_agents.policy.cost import CostModel


@pytest.mark.parametrize("pipeline", [stream_reply, stream_reply_deltas])
def test_a_cancel_flag_ends_a_batched_request_at_once(tiny_model, byte_tokenizer, monkeypatch, pipeline) -> None:
    """Setting the flag cancels the batching engine's stream in the setting thread, not after its next event."""
    cancels: list[int] = []
    cancel = batch._Events.cancel

    def counted(events) -> None:
        cancels.append(1)
        cancel(events)

    monkeypatch.setattr(batch._Events, "cancel", counted)
    engine = Engine(tiny_model, byte_tokenizer, eos_token_ids=(), cost_model=CostModel.linear(0.02), draft_head=None,
                    prefix_cache_bytes=0, max_batch=2)
    request = build_chat_request(engine, [{"role": "user", "content": "count on"}],
                                 settings=ChatSettings(method="ar", max_tokens=64))
    flag = CancelFlag()
    replies = pipeline(request, flag)
    next(replies)
    assert cancels == []
    flag.set()
    assert cancels == [1]  # the request leaves the batch at the end of the step in progress
    replies.close()
