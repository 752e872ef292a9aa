"""bench-structured's parts on the tiny random model: schemas and BFCL-style questions through the server."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from hvd_agents import Engine
from hvd_agents.bench.structured import _matches, bfcl_schema, refusal_reason, run_bfcl, run_schemas
from hvd_agents.server.app import create_app
from hvd_agents.server.config import ServerConfig
from tests.helpers import IM_END_ID
from tests.tiny import make_tiny_llama


@pytest.fixture(scope="module")
def engine(byte_tokenizer) -> Engine:
    """A tiny random model with room for a tools block in the byte tokenizer's long prompts."""
    return Engine(make_tiny_llama(len(byte_tokenizer), seed=7, max_positions=2048), byte_tokenizer,
                  eos_token_ids=(IM_END_ID,), draft_head=None)


def test_bfcl_types_become_json_schema_types() -> None:
    schema = {"type": "dict", "properties": {"x": {"type": "float", "default": 1.0}, "type": {"type": "string"},
                                             "t": {"type": "tuple", "items": {"type": "any"}}}}
    assert bfcl_schema(schema) == {"type": "object", "properties": {
        "x": {"type": "number"}, "type": {"type": "string"}, "t": {"type": "array", "items": {}}}}


def test_refusals_are_grouped_by_the_keyword_they_name() -> None:
    assert refusal_reason("the JSON schema cannot be enforced: unsupported keyword 'not' at /a/not") == \
        "unsupported keyword 'not'"
    assert _matches({"city": "Oslo"}, {"city": ["Oslo", "oslo"], "unit": ["", "c"]})
    assert not _matches({"city": "Rome"}, {"city": ["Oslo"]})


def test_schemas_and_questions_through_the_server(engine, tmp_path) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                                                 "required": ["ok"]}))
    (tmp_path / "b.json").write_text(json.dumps({"type": "object", "properties": {"a": {"not": {}}}}))
    question = {"id": "q0", "question": [[{"role": "user", "content": "hi"}]], "function": [
        {"name": "pick", "description": "Pick.", "parameters": {"type": "dict", "required": ["v"],
                                                                  "properties": {"v": {"enum": ["x", "y"]}}}}]}
    with TestClient(create_app(ServerConfig(port=0), engine=engine)) as client:
        name = client.get("/v1/models").json()["data"][0]["id"]
        schemas = run_schemas(client, name, sorted(tmp_path.glob("*.json")), max_tokens=40)
        calls = run_bfcl(client, name, [question], {"q0": [{"pick": {"v": ["x"]}}]}, max_tokens=120)
    # b.json names a keyword the grammar cannot enforce: lenient, it is ignored, and the reply is answered
    assert schemas.sent == 2 and schemas.server_errors == 0 and schemas.answered == 2
    assert schemas.valid + schemas.cut + len(schemas.invalid) == 2
    assert calls.asked == calls.valid == calls.expected_function == 1 and calls.server_errors == 0
