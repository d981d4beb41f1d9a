"""The google-genai driver's adaptation of the lab's request line (labs/clients/python_gemini.py):
the base URL split into google-genai's root and API version, the Chat-shaped messages and tools
as Gemini's. No process, no network."""

from __future__ import annotations

import pytest

from labs.clients.python_gemini import gemini_config, gemini_contents, gemini_root
from labs.scenario import WORKER_TOOL


@pytest.mark.parametrize(
    ("base_url", "root"),
    [
        ("http://127.0.0.1:4000/v1", ("http://127.0.0.1:4000", "v1")),
        ("http://127.0.0.1:4000/route/v1/", ("http://127.0.0.1:4000/route", "v1")),
        ("http://127.0.0.1:4000/v1beta", ("http://127.0.0.1:4000", "v1beta")),
    ],
)
def test_the_root_and_the_version_give_back_the_labs_path(base_url, root):
    # google-genai builds `{base_url}/{api_version}/models/...`: the request reaches the lab's path.
    assert gemini_root(base_url) == root


def test_a_base_url_without_a_version_is_refused_in_one_line():
    with pytest.raises(ValueError, match="does not end in a version"):
        gemini_root("http://127.0.0.1:4000/gemini")


def test_messages_become_contents_with_the_models_role_and_a_system_instruction():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "The quick"},
    ]
    contents, system = gemini_contents(messages)
    assert contents == [{"role": "user", "parts": [{"text": "hi"}]}, {"role": "model", "parts": [{"text": "The quick"}]}]
    assert system == "Be brief."


def test_the_limit_and_the_tools_become_the_generation_config():
    config = gemini_config({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7, "tools": [WORKER_TOOL]})
    assert config["max_output_tokens"] == 7 and "system_instruction" not in config
    [declaration] = config["tools"][0]["function_declarations"]
    assert declaration["name"] == WORKER_TOOL["function"]["name"]
    assert declaration["parameters_json_schema"] == WORKER_TOOL["function"]["parameters"]
    assert config["automatic_function_calling"] == {"disable": True}
