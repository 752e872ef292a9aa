"""A GGUF file loaded for the native forward from one parse of the file, holding its blocks once.

* :class:`~hvd_agents.runtime.gguf_file.GGUFFile` reads what ``gguf.GGUFReader`` reads (metadata, tensor types,
  shapes and bytes); the config built from it is the one ``AutoConfig`` builds, and the tokenizer the one
  ``AutoTokenizer`` builds, for every family's file;
* after ``load_model``, no numpy array of the file's blocks is reachable from the loaded model (the blocks live
  in the native model's tiles only), the embedding table is a file mapping holding exactly the values the
  native forward reads, and the logits are those of the weights attached directly;
* ``write_gguf`` writes one tensor at a time the tensors ``gguf_tensors`` gives; a phi3 file has the control
  tokens llama.cpp looks up in a phi3 vocabulary (llama.cpp loads every family's file when it is installed);
* the scale bench writes a Llama-3.2-1B-shaped file once.
"""

from __future__ import annotations

import gc
import importlib.util
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from hvd_agents.bench.gguf_files import gguf_tensors, write_gguf
from hvd_agents.runtime.cpu import native_forward
from hvd_agents.runtime.cpu import weights as quant_weights
from hvd_agents.runtime.cpu.loading import skeleton
from hvd_agents.runtime.cpu.runner import NativeModel, QuantRunner
from hvd_agents.runtime.gguf_config import gguf_config
from hvd_agents.runtime.gguf_file import GGUFFile, StringArray
from hvd_agents.runtime.gguf_tokenizer import gguf_tokenizer
from tests.arch_models import FAMILIES, make_model
from tests.tiny_gguf import write_tiny_gguf

TEXT = "Hello <|im_start|>user world\n  <s> 123 h\u00e9llo </s> \u4f60\u597d"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> a GGUF file: each family's tiny model in Q8_0, and the tiny chat-template file."""
    root = tmp_path_factory.mktemp("gguf")
    out = {f: write_gguf(make_model(f), root / f"{f}.gguf", "Q8_0") for f in FAMILIES}
    out["tiny"] = write_tiny_gguf(root / "tiny.gguf", chat_template="{{ messages }}")
    return out


def _reader_value(field):
    from gguf import GGUFValueType

    if field.types[0] == GGUFValueType.ARRAY:
        if field.types[-1] == GGUFValueType.STRING:
            return StringArray(len(field.data)) if len(field.data) != 1 else bytes(field.parts[field.data[0]]).decode()
        values = [field.parts[i].tolist()[0] for i in field.data]
        return values[0] if len(values) == 1 else values
    if field.types[0] == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode()
    return field.parts[-1].tolist()[0]


@pytest.mark.parametrize("name", [*FAMILIES, "tiny"])
def test_the_file_is_read_as_gguf_reader_reads_it(files, name) -> None:
    from gguf import GGUFReader

    path = files[name]
    ours, reader = GGUFFile(path), GGUFReader(str(path))
    expected = {k: _reader_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata == expected
    assert list(ours.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        mine = ours.tensors[t.name]
        assert mine.tensor_type == t.tensor_type and mine.shape == tuple(int(x) for x in t.shape)
        assert mine.n_elements == int(t.n_elements)
        assert mine.data.dtype == t.data.dtype and mine.data.tobytes() == np.asarray(t.data).tobytes()


@pytest.mark.parametrize("name", [*FAMILIES, "tiny"])
def test_config_and_tokenizer_are_the_ones_transformers_builds(files, name) -> None:
    path = files[name]
    config = gguf_config(GGUFFile(path))
    assert config.to_dict() == AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
    tokenizer = gguf_tokenizer(path, config)
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(tokenizer) is type(reference)
    ids = reference(TEXT)["input_ids"]
    assert tokenizer(TEXT)["input_ids"] == ids and tokenizer.decode(ids) == reference.decode(ids)
    assert tokenizer.special_tokens_map == reference.special_tokens_map and len(tokenizer) == len(reference)
    assert tokenizer.chat_template == reference.chat_template


def _reachable_arrays(root) -> list[np.ndarray]:
    """Every numpy array reachable from ``root`` through Python references (a function's closure and defaults,
    not its module's globals)."""
    seen, found, stack = set(), [], [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, str, bytes, int, float, types.ModuleType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            found.append(obj)
        elif isinstance(obj, types.FunctionType):
            stack.extend(cell.cell_contents for cell in obj.__closure__ or () if cell.cell_contents is not None)
            stack.extend(obj.__defaults__ or ())
        else:
            stack.extend(gc.get_referents(obj))
    return found


def _mapped_file(address: int) -> str:
    """The file mapped at ``address`` in this process ("" for anonymous memory)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if start <= address < end:
            return parts[5] if len(parts) > 5 else ""
    return ""


@pytest.mark.skipif(not native_forward.available(), reason="the native kernel needs x86-64 with AVX2")
def test_a_native_load_keeps_the_blocks_once_and_maps_its_embedding(files, tmp_path, monkeypatch) -> None:
    from hvd_agents.runtime.loading import load_model

    monkeypatch.setenv("HVD_AGENTS_CACHE", str(tmp_path))
    path = files["llama"]
    loaded = load_model(path, device="cpu", cpu_weights="gguf")
    native = loaded.native
    assert native is not None and native.info.scheme == "gguf"
    arrays = _reachable_arrays((loaded, native))
    assert not [a for a in arrays if a.dtype == np.uint8], "a numpy copy of the file's blocks is still reachable"
    assert not [a.shape for a in arrays if a.ndim > 1], "a matrix is still reachable as a numpy array"
    # the embedding: a private mapping of its cache file, exactly the rows the native forward reads
    embed = loaded.model.get_input_embeddings().weight
    assert _mapped_file(embed.data_ptr()).startswith(str(tmp_path / "embeddings"))
    parsed = GGUFFile(path)
    assert torch.equal(embed, torch.from_numpy(quant_weights.dense_rows(parsed.tensors["token_embd.weight"], 0,
                                                                        embed.shape[0])))
    output = loaded.model.get_output_embeddings().weight  # this file has its own output matrix: a second table
    assert "output.weight" in parsed.tensors and output is not embed
    assert _mapped_file(output.data_ptr()).startswith(str(tmp_path / "embeddings"))
    assert torch.equal(output, torch.from_numpy(quant_weights.dense_rows(parsed.tensors["output.weight"], 0,
                                                                         output.shape[0])))
    # the same logits as the file's weights attached directly
    ids = list(range(3, 40))
    runner = QuantRunner(native)
    got = runner.forward(runner.new_kv(), ids)
    model = skeleton(parsed)
    direct = QuantRunner(NativeModel(model, quant_weights.from_gguf(parsed, model), 512))
    assert torch.equal(got, direct.forward(direct.new_kv(), ids))
    # the weights can be read again (another CPU path is built this way)
    assert native.reload().formats == native.info.formats


def test_write_gguf_writes_the_tensors_one_at_a_time(tmp_path) -> None:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    model = make_model("qwen2")
    path = write_gguf(model, tmp_path / "q.gguf", "Q8_0", rng=np.random.default_rng(3))
    expected = gguf_tensors(model, np.random.default_rng(3))
    reader = GGUFReader(str(path))
    assert [t.name for t in reader.tensors] == list(expected)
    for t in reader.tensors:
        values = dequantize(np.asarray(t.data), t.tensor_type).reshape(expected[t.name].shape)
        tolerance = 0 if t.tensor_type.name == "F32" else np.abs(expected[t.name]).max() / 100
        assert np.abs(values - expected[t.name]).max() <= tolerance, t.name


def test_a_phi3_file_has_the_control_tokens_llama_cpp_looks_up_by_name(files) -> None:
    # llama.cpp sets attributes of "<unk>", "<s>", "</s>" and "<|endoftext|>" by name in a model named phi3, and
    # refuses the vocabulary when one is missing
    from gguf import GGUFReader

    from hvd_agents.bench.gguf_files import PHI3_TOKENS

    reader = GGUFReader(str(files["phi3"]))
    tokens = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]).decode()
              for i in reader.fields["tokenizer.ggml.tokens"].data]
    types = [int(reader.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in reader.fields["tokenizer.ggml.token_type"].data]
    assert "phi3" in bytes(reader.fields["general.name"].parts[-1]).decode()
    for token in ("<unk>", "<s>", "</s>", *PHI3_TOKENS):
        assert token in tokens
    assert all(types[tokens.index(token)] == 3 for token in ("<s>", "</s>", *PHI3_TOKENS))  # control tokens
    assert tokens.count("<0x41>") == 1 and types[tokens.index("<0x41>")] == 6  # byte tokens still there
    other = GGUFReader(str(files["llama"]))
    assert "<|endoftext|>" not in {bytes(other.fields["tokenizer.ggml.tokens"].parts[i]).decode()
                                   for i in other.fields["tokenizer.ggml.tokens"].data}


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
@pytest.mark.parametrize("name", FAMILIES)
def test_llama_cpp_loads_and_runs_every_family_file(files, name) -> None:
    import llama_cpp

    llm = llama_cpp.Llama(str(files[name]), n_ctx=32, n_threads=1, verbose=False)
    llm.eval([1, 5, 7])
    assert llm.n_tokens == 3


def test_the_scale_bench_builds_a_llama_3_2_1b_shape(monkeypatch, tmp_path) -> None:
    from hvd_agents.bench import archs

    written = {}

    def fake_write(model, path, qtype, rng=None):
        written["config"] = model.config
        Path(path).write_bytes(b"f16")
        return Path(path)

    monkeypatch.setattr("hvd_agents.bench.gguf_files.write_gguf", fake_write)
    monkeypatch.setattr("hvd_agents.bench.gguf_files.quantize_gguf",
                        lambda source, target, ftype, threads: Path(target).write_bytes(ftype.encode()))
    path = archs.make_scale_file("1b", tmp_path, 2)
    config = written["config"]
    assert path == tmp_path / "random-llama-1b-q4_k_m.gguf" and path.read_bytes() == b"Q4_K_M"
    assert not (tmp_path / "random-llama-1b-f16.gguf").exists()
    assert (config.model_type, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size, config.vocab_size, config.tie_word_embeddings) == (
        "llama", 2048, 16, 32, 8, 8192, 128256, True)
    written.clear()
    assert archs.make_scale_file("1b", tmp_path, 2) == path and not written  # cached: not written again
    with pytest.raises(ValueError, match="scale"):
        archs.make_scale_file("70b", tmp_path, 2)


def test_f16_matrices_are_held_in_16_bits_and_give_the_float32_files_logits(tmp_path) -> None:
    # the same weights (values of float16) written as an F32 file and as an F16 file: the F16 file's matrices stay
    # 16-bit on the native forward (half the bytes) and its logits and keys are bitwise the F32 file's
    model = make_model("llama")
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.half().float())
    f32 = GGUFFile(write_gguf(model, tmp_path / "f32.gguf", "F32"))
    f16 = GGUFFile(write_gguf(model, tmp_path / "f16.gguf", "F16"))
    weights32 = quant_weights.from_gguf(f32, skeleton(f32))
    weights16 = quant_weights.from_gguf(f16, skeleton(f16))
    assert {w.fmt for w in weights16.layers[0].values()} == {native_forward.F16}
    assert sum(w.nbytes for w in weights16.layers[0].values()) * 2 == sum(w.nbytes for w in weights32.layers[0].values())
    ids = list(range(3, 60))
    outputs = []
    for parsed, weights in ((f32, weights32), (f16, weights16)):
        runner = QuantRunner(NativeModel(skeleton(parsed), weights, 512))
        kv = runner.new_kv()
        outputs.append((runner.forward(kv, ids[:40]), runner.forward(kv, ids[40:]), kv.k[:, :, :57].clone()))
    assert all(torch.equal(a, b) for a, b in zip(*outputs))
