"""Chat templates of GGUF files, and models without one, on tiny GGUF files the test writes.

A GGUF file's ``tokenizer.chat_template`` is the model's template, rendered as transformers
renders it. A model without one (a base model) continues plain text: ``generate`` says so
and does not wrap the prompt in any template, ``generate --raw`` and ``/v1/completions``
never template, and chat requests (``prepare``, the server's chat completions, ChatHVD,
the LlamaIndex ``HVD``) are refused with an error naming the missing template, unless one
is given (``--chat-template FILE``, ``load_model(..., chat_template=...)``, the server's
``chat_template``).
"""

from __future__ import annotations

import json

import httpx
import pytest

from hvd_agents import Engine, GenerationParams
from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.request import DEFAULT_MODEL_NAME
from hvd_agents.cli import main
from hvd_agents.errors import InvalidRequestError
from hvd_agents.policy import CostModel
from hvd_agents.runtime.chat_template import read_chat_template
from hvd_agents.runtime.loading import load_model, load_tokenizer
from tests.server_helpers import running_server
from tests.tiny_gguf import write_tiny_gguf

TEMPLATE = ("{% for m in messages %}<|im_start|>[{{ m['role'] }}] {{ m['content'] }}<|im_end|>{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>[assistant] {% endif %}")
USER = [{"role": "user", "content": "hello there"}]
MODEL = DEFAULT_MODEL_NAME  # what the test server serves


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny GGUF with and without a template; the model cache in a temporary directory, the model's own
    forward (the native CPU forward is not what these tests are about)."""
    root = tmp_path_factory.mktemp("gguf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HVD_AGENTS_CACHE", str(root / "cache"))
        patch.setenv("HVD_AGENTS_CPU_WEIGHTS", "none")
        yield {
            "chat": write_tiny_gguf(root / "tiny-chat.gguf", chat_template=TEMPLATE),
            "base": write_tiny_gguf(root / "tiny-base.gguf"),
            "root": root,
        }


def engine_for(path, **kwargs) -> Engine:
    loaded = load_model(path, device="cpu", **kwargs)
    return Engine.from_loaded(loaded, draft_head=None, cost_model=CostModel.linear(0.02))


def test_the_gguf_chat_template_is_the_models_and_renders_as_transformers_does(files) -> None:
    assert load_tokenizer(files["chat"]).chat_template == TEMPLATE  # read from the metadata, no weights
    engine = engine_for(files["chat"])
    assert engine.tokenizer.chat_template == TEMPLATE
    structure = prepare(engine, USER)
    expected = engine.tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert expected == "<|im_start|>[user] hello there<|im_end|><|im_start|>[assistant] "
    assert engine.tokenizer.decode(structure.prompt_ids) == expected


def test_a_model_without_a_template_refuses_chat_requests_by_name(files) -> None:
    engine = engine_for(files["base"])
    assert not load_tokenizer(files["base"]).chat_template and not engine.tokenizer.chat_template
    with pytest.raises(InvalidRequestError, match=r"no chat template \(tokenizer.chat_template\).*--chat-template"):
        prepare(engine, USER)
    from langchain_hvd import ChatHVD
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.hvd import HVD

    with pytest.raises(InvalidRequestError, match="no chat template"):
        ChatHVD(engine=engine, max_tokens=4).invoke("hello there")
    with pytest.raises(InvalidRequestError, match="no chat template"):
        HVD(engine=engine, max_tokens=4).chat([ChatMessage(role="user", content="hello there")])


def test_the_server_refuses_chats_and_completes_plain_text_without_a_template(files) -> None:
    engine = engine_for(files["base"])
    plain = list(engine.tokenizer("hello there").input_ids)
    with running_server(engine) as url:
        chat = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER, "max_tokens": 4}, timeout=60)
        completion = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "hello there", "max_tokens": 4}, timeout=60)
    assert chat.status_code == 400 and "no chat template" in chat.json()["error"]["message"]
    assert completion.status_code == 200
    assert completion.json()["usage"]["prompt_tokens"] == len(plain)  # the text alone, no template around it


def test_the_server_completes_plain_text_with_a_template_too_and_chats_with_a_given_one(files) -> None:
    engine = engine_for(files["chat"])
    with running_server(engine) as url:
        completion = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "hello there", "max_tokens": 4}, timeout=60)
    assert completion.json()["usage"]["prompt_tokens"] == len(engine.tokenizer("hello there").input_ids)
    base = engine_for(files["base"])
    with running_server(base, chat_template=TEMPLATE) as url:
        chat = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER, "max_tokens": 4}, timeout=60)
    assert chat.status_code == 200
    rendered = base.tokenizer.apply_chat_template(USER, tokenize=True, add_generation_prompt=True)
    assert chat.json()["usage"]["prompt_tokens"] == len(getattr(rendered, "input_ids", rendered))


def test_a_template_given_at_load_or_from_a_file(files, tmp_path) -> None:
    engine = engine_for(files["base"], chat_template=TEMPLATE)
    assert engine.tokenizer.decode(prepare(engine, USER).prompt_ids).startswith("<|im_start|>[user] hello there")
    good = tmp_path / "t.jinja"
    good.write_text(TEMPLATE, encoding="utf-8")
    assert read_chat_template(good) == TEMPLATE
    (tmp_path / "empty.jinja").write_text("  \n", encoding="utf-8")
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}", encoding="utf-8")
    for name, cause in (("missing.jinja", "cannot read"), ("empty.jinja", "is empty"), ("bad.jinja", "not a valid")):
        with pytest.raises(InvalidRequestError, match=cause):
            read_chat_template(tmp_path / name)


def generated_prompts(monkeypatch) -> list[list[int]]:
    """The prompt ids every ``Engine.generate`` call gets, from now on."""
    prompts: list[list[int]] = []
    original = Engine.generate

    def recording(self, prompt_ids, params: GenerationParams, **kwargs):
        prompts.append(list(prompt_ids))
        return original(self, prompt_ids, params, **kwargs)

    monkeypatch.setattr(Engine, "generate", recording)
    return prompts


def copy_of(path, tmp_path, name: str):
    """A copy of a GGUF file under its own name: the CLI's process-wide engine is per file."""
    target = tmp_path / name
    target.write_bytes(path.read_bytes())
    return target


def test_generate_on_a_model_without_a_template_continues_plain_text_and_says_so(files, tmp_path, monkeypatch,
                                                                                  capsys) -> None:
    prompts = generated_prompts(monkeypatch)
    model = str(copy_of(files["base"], tmp_path, "cli-base.gguf"))
    tokenizer = load_tokenizer(model)
    common = ["--model", model, "--device", "cpu", "--method", "ar", "--max-new-tokens", "3", "--json"]
    assert main(["generate", "--prompt", "hello there", *common]) == 0
    assert "no chat template" in capsys.readouterr().err
    assert prompts[-1] == list(tokenizer("hello there").input_ids)  # no ChatML around it
    assert main(["generate", "--prompt", "hello there", "--system", "be brief", *common]) == 2
    assert "--system and --tools" in capsys.readouterr().err


def test_generate_raw_never_templates_and_chat_template_file_gives_one(files, tmp_path, monkeypatch, capsys) -> None:
    prompts = generated_prompts(monkeypatch)
    chat = str(copy_of(files["chat"], tmp_path, "cli-chat.gguf"))
    tokenizer = load_tokenizer(chat)
    common = ["--device", "cpu", "--method", "ar", "--max-new-tokens", "3", "--json"]
    assert main(["generate", "--model", chat, "--prompt", "hello there", "--raw", *common]) == 0
    assert prompts[-1] == list(tokenizer("hello there").input_ids)
    assert main(["generate", "--model", chat, "--prompt", "hello there", *common]) == 0
    assert tokenizer.decode(prompts[-1]) == "<|im_start|>[user] hello there<|im_end|><|im_start|>[assistant] "
    assert "no chat template" not in capsys.readouterr().err
    template = tmp_path / "other.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }} =>{% endfor %}", encoding="utf-8")
    base = str(copy_of(files["base"], tmp_path, "cli-given.gguf"))
    assert main(["generate", "--model", base, "--chat-template", str(template), "--prompt", "hi", *common]) == 0
    assert tokenizer.decode(prompts[-1]) == "hi =>"
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["finish_reason"] == "length"
