"""models.load_tokenizer (the tokenizer of ``hvd-agents analyze``): no weights are loaded."""

from __future__ import annotations

import pytest
import torch

from hvd_agents.errors import ModelNotFoundError
from hvd_agents.runtime import loading as models
from hvd_agents.runtime import weight_cache
from tests.helpers import make_byte_tokenizer
from tests.tiny import make_tiny_llama


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fake_gguf(tmp_path):
    path = tmp_path / "ggufs" / "tiny-model.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    return path


def test_saved_tokenizer_directory(tmp_path) -> None:
    make_byte_tokenizer().save_pretrained(tmp_path / "tok")
    tok = models.load_tokenizer(tmp_path / "tok")
    assert tok("hi there", add_special_tokens=False).input_ids == make_byte_tokenizer()("hi there").input_ids
    assert tok.chat_template


def test_gguf_uses_the_validated_cache_without_loading_weights(fake_gguf, cache_env, monkeypatch) -> None:
    target = weight_cache.cache_dir(fake_gguf)
    assert weight_cache.write(make_tiny_llama(264, dtype=torch.float32), make_byte_tokenizer(), target, "test")
    monkeypatch.setattr(models, "AutoModelForCausalLM", None)  # any weight load would fail
    tok = models.load_tokenizer(fake_gguf)
    assert tok.convert_tokens_to_ids("<|im_end|>") == 258


def test_gguf_without_cache_reads_the_gguf(fake_gguf, cache_env, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(models, "_tokenizer_from", lambda location, **kw: calls.append((location, kw)) or "tok")
    assert models.load_tokenizer(str(fake_gguf)) == "tok"
    assert calls == [(str(fake_gguf.parent.resolve()), {"gguf_file": "tiny-model.gguf"})]
    assert not (cache_env / "models").exists()  # no cache is built for a tokenizer


def test_missing_path_is_not_found(tmp_path) -> None:
    with pytest.raises(ModelNotFoundError):
        models.load_tokenizer(tmp_path / "nothing-here")
