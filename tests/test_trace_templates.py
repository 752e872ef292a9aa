"""Prompt templates (top-level templates/) and the canonical tool-schema transform."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hvd_agents.chat.prompt_templates import (
    Template,
    apply_system_template,
    available_templates,
    canonicalize_tools,
    load_template,
    templates_dir,
)
from hvd_agents.errors import HVDError, InvalidRequestError
from tests.trace_data import FILE_TOOL, WEATHER_TOOL


def test_templates_load_by_name() -> None:
    assert {"agent-system", "tool-schemas-canonical"} <= set(available_templates())
    system = load_template("agent-system")
    assert system.name == "agent-system" and system.kind == "system-prompt" and system.purpose
    assert "verbatim" in system.text and "<tool_call>" in system.text and "schema" in system.text
    assert not system.text.startswith("---") and system.path.parent == templates_dir()
    doc = load_template("tool-schemas-canonical")
    assert doc.kind == "document" and "canonicalize_tools" in doc.text
    assert templates_dir().name == "templates" and templates_dir().parent.joinpath("hvd_agents").is_dir()


def test_unknown_template_lists_the_available_ones() -> None:
    with pytest.raises(InvalidRequestError, match="unknown template 'nope'; available: agent-system, "):
        load_template("nope")


def test_templates_dir_override_and_bad_front_matter(tmp_path, monkeypatch) -> None:
    (tmp_path / "mine.txt").write_text("---\nname: mine\nkind: system-prompt\npurpose: test\n---\nHello.\n")
    (tmp_path / "plain.md").write_text("No front matter.\n")
    (tmp_path / "broken.txt").write_text("---\nname: broken\nno colon here\n---\nx\n")
    monkeypatch.setenv("HVD_AGENTS_TEMPLATES", str(tmp_path))
    assert available_templates() == ("broken", "mine", "plain")
    assert load_template("mine").text == "Hello."
    assert load_template("plain").kind == "document" and load_template("plain").text == "No front matter."
    with pytest.raises(HVDError, match="not 'key: value'"):
        load_template("broken")
    monkeypatch.setenv("HVD_AGENTS_TEMPLATES", str(tmp_path / "missing"))
    with pytest.raises(HVDError, match="templates directory"):
        available_templates()


def _shuffled(tools: list[dict], seed: int) -> list[dict]:
    """The same tools in another order, every mapping's keys shuffled except 'properties' and 'required'."""
    rng = random.Random(seed)

    def shuffle(value, parent_key=None):
        if isinstance(value, dict):
            items = [(k, shuffle(v, k)) for k, v in value.items()]
            if parent_key != "properties":
                rng.shuffle(items)
            return dict(items)
        return value

    out = [shuffle(t) for t in tools]
    rng.shuffle(out)
    return out


def test_canonicalize_tools_is_deterministic_and_idempotent() -> None:
    tools = [WEATHER_TOOL, FILE_TOOL]
    canonical = canonicalize_tools(tools)
    assert [t["function"]["name"] for t in canonical] == ["get_weather", "read_file"]
    assert list(canonical[0]) == ["type", "function"]
    assert list(canonical[0]["function"]) == ["name", "description", "parameters"]
    assert list(canonical[0]["function"]["parameters"]) == ["type", "properties", "required"]
    assert list(canonical[0]["function"]["parameters"]["properties"]) == ["city", "unit"]  # given order kept
    assert list(canonical[0]["function"]["parameters"]["properties"]["city"]) == ["type", "description"]
    for seed in range(5):
        assert json.dumps(canonicalize_tools(_shuffled(tools, seed))) == json.dumps(canonical)
    assert json.dumps(canonicalize_tools(canonical)) == json.dumps(canonical)


def test_canonicalize_tools_keeps_shape_and_input() -> None:
    bare = {"parameters": {"required": ["b", "a"], "properties": {"b": {}, "a": {"items": {"type": "x", "a": 1}}},
                           "type": "object"}, "x-extra": 1, "name": "zeta", "description": "d"}
    original = copy.deepcopy(bare)
    out = canonicalize_tools([bare, WEATHER_TOOL])
    assert bare == original  # not modified
    assert out[0]["function"]["name"] == "get_weather" and "type" not in out[1]  # bare stays bare
    assert list(out[1]) == ["name", "description", "parameters", "x-extra"]
    assert out[1]["parameters"]["required"] == ["b", "a"] and list(out[1]["parameters"]["properties"]) == ["b", "a"]
    assert list(out[1]["parameters"]["properties"]["a"]["items"]) == ["type", "a"]
    assert canonicalize_tools(None) == [] and canonicalize_tools([]) == []
    with pytest.raises(InvalidRequestError):
        canonicalize_tools([{"description": "no name"}])


def test_apply_system_template() -> None:
    template = Template("t", "system-prompt", "", "RULES", templates_dir())
    with_system = [{"role": "system", "content": "Own."}, {"role": "user", "content": "hi"}]
    assert apply_system_template(with_system, template)[0]["content"] == "RULES\n\nOwn."
    assert with_system[0]["content"] == "Own."
    without = [{"role": "user", "content": "hi"}]
    assert apply_system_template(without, template) == [{"role": "system", "content": "RULES"}, without[0]]


def test_the_earlier_import_path_gives_the_same_objects() -> None:
    from hvd_agents.chat import prompt_templates, templates

    assert templates.__all__ and all(getattr(templates, name) is getattr(prompt_templates, name)
                                     for name in templates.__all__)


def test_a_wheel_carries_the_templates(tmp_path) -> None:
    """An installed (not editable) package finds the templates without the checkout."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(root)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("hvd_agents-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.startswith("hvd_agents/templates/")}
    assert shipped == {f"hvd_agents/templates/{p.name}" for p in (root / "templates").iterdir() if p.is_file()}
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "site")
    probe = ("import hvd_agents.chat.templates as t; print(t.templates_dir()); "
             "print(t.load_template('agent-system').purpose)")
    env = {k: v for k, v in os.environ.items() if k != "HVD_AGENTS_TEMPLATES"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={**env, "PYTHONPATH": str(tmp_path / "site")},
                         check=True, capture_output=True, text=True).stdout.splitlines()
    assert Path(out[0]) == tmp_path / "site" / "hvd_agents" / "templates"
    assert out[1] == load_template("agent-system").purpose
