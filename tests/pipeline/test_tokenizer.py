"""The tokenizer wrapper: offline loading, EOS and special ids, single-token lookups, and what it
reads from a chat template (thinking toggle and default, content format)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smg.pipeline.tokenizers import ChatTemplateError, Tokenizer
from tests.pipeline import _toy


def test_loads_a_fixture_directory_with_generation_config_eos() -> None:
    tok = _toy.fixture("qwen3")
    assert tok.eos_token_ids == [4002, 4000]
    assert tok.name == "qwen3"
    assert tok.source.endswith("qwen3")
    assert tok.vocab_size == 4000  # the base vocabulary, as the reference reports it (14 added tokens left out)
    assert {4000, 4001, 4002} <= tok.special_ids


def test_eos_falls_back_to_the_tokenizer_without_generation_config(tmp_path: Path) -> None:
    toy = _toy.byte_level()
    toy._hf.save_pretrained(tmp_path)
    loaded = Tokenizer.load(tmp_path)
    assert loaded.eos_token_ids == [toy.token_id("<|im_end|>")]
    assert loaded.chat_template == _toy.STRING_TEMPLATE


def test_generation_config_eos_may_be_a_single_int(tmp_path: Path) -> None:
    _toy.byte_level()._hf.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert Tokenizer.load(tmp_path).eos_token_ids == [7]


def test_chat_template_override_from_text_file_and_json(tmp_path: Path) -> None:
    _toy.byte_level()._hf.save_pretrained(tmp_path)
    text = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert Tokenizer.load(tmp_path, chat_template=text).chat_template == text
    jinja = tmp_path / "override.jinja"
    jinja.write_text(text + "!")
    assert Tokenizer.load(tmp_path, chat_template=jinja).chat_template == text + "!"
    assert Tokenizer.load(tmp_path, chat_template=str(jinja)).chat_template == text + "!"
    as_json = tmp_path / "chat_template.override.json"
    as_json.write_text(json.dumps({"chat_template": text + "?"}))
    assert Tokenizer.load(tmp_path, chat_template=as_json).chat_template == text + "?"
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(tmp_path, chat_template=tmp_path / "missing.jinja")


def test_encode_adds_no_special_tokens() -> None:
    llama = _toy.fixture("llama3")
    bos = llama.token_id("<|begin_of_text|>")
    assert bos is not None
    assert bos not in llama.encode("hello")
    assert llama.decode(llama.encode("hello world")) == "hello world"


def test_token_id_is_the_single_id_or_none() -> None:
    tok = _toy.fixture("qwen3")
    assert tok.token_id("<|im_end|>") == 4002
    assert tok.token_id("hello world, this is long") is None
    assert tok.token_id("") is None


def test_decode_skips_special_tokens_on_request() -> None:
    tok = _toy.byte_level()
    end = tok.token_id("<|im_end|>")
    assert end is not None
    ids = tok.encode("Hello") + [end]
    assert tok.decode(ids) == "Hello"
    assert tok.decode(ids, skip_special_tokens=False) == "Hello<|im_end|>"


@pytest.mark.parametrize(
    ("name", "toggle", "default"),
    [
        ("qwen3", "enable_thinking", True),
        ("deepseek", "thinking", False),
        ("llama3", None, None),
        ("mistral", None, None),
    ],
)
def test_thinking_toggle_of_fixture_templates(name: str, toggle: str | None, default: bool | None) -> None:
    tok = _toy.fixture(name)
    assert (tok.thinking_toggle, tok.thinking_default) == (toggle, default)


def test_thinking_toggle_of_toy_templates() -> None:
    assert (_toy.byte_level().thinking_toggle, _toy.byte_level().thinking_default) == ("enable_thinking", True)
    bare = _toy.byte_level(_toy.BARE_THINKING_TEMPLATE)
    assert (bare.thinking_toggle, bare.thinking_default) == ("thinking", False)
    off = _toy.byte_level("{% set enable_thinking = enable_thinking | default(false) %}{{ enable_thinking }}")
    assert (off.thinking_toggle, off.thinking_default) == ("enable_thinking", False)
    # A `thinking` read off a message is no toggle.
    scoped = _toy.byte_level("{% for m in messages %}{{ m.thinking }}{% endfor %}")
    assert scoped.thinking_toggle is None


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (_toy.STRING_TEMPLATE, "string"),
        (_toy.PARTS_TEMPLATE, "openai"),
        ("{% for m in messages %}{% for p in m['content'] | list %}{{ p.text }}{% endfor %}{% endfor %}", "openai"),
        ("{% set msgs = messages %}{% for m in msgs %}{% for p in m.content %}x{% endfor %}{% endfor %}", "openai"),
        (
            "{% macro show(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
            "{% for m in messages %}{{ show(m.content) }}{% endfor %}",
            "openai",
        ),
        (
            "{% for m in messages %}{% set content = m.content %}{% for p in content %}x{% endfor %}{% endfor %}",
            "openai",
        ),
        ("{% for m in messages %}{{ m.content | length }}{{ m.content[0] }}{% endfor %}", "string"),
        ("{% for m in messages %}{% for p in m.content %", "string"),
    ],
)
def test_content_format(template: str, expected: str) -> None:
    assert _toy.byte_level(template).content_format == expected


@pytest.mark.parametrize("name", _toy.FIXTURE_NAMES)
def test_fixture_templates_take_content_parts(name: str) -> None:
    assert _toy.fixture(name).content_format == "openai"


def test_render_keeps_none_content_and_appends_the_generation_prompt() -> None:
    tok = _toy.byte_level()
    text = tok.render([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}])
    assert "NONE" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert not tok.render([{"role": "user", "content": "hi"}], add_generation_prompt=False).endswith("assistant\n")


def test_render_continues_a_final_message() -> None:
    tok = _toy.byte_level()
    text = tok.render(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}],
        continue_final_message=True,
    )
    assert text.endswith("<|im_start|>assistant\nThe answer is")


def test_render_errors_are_chat_template_errors() -> None:
    failing = _toy.byte_level("{{ raise_exception('no system messages') }}")
    with pytest.raises(ChatTemplateError, match="no system messages"):
        failing.render([{"role": "user", "content": "hi"}])
    with pytest.raises(ChatTemplateError, match="no chat template"):
        _toy.byte_level(None).render([{"role": "user", "content": "hi"}])
    assert _toy.byte_level(None).thinking_toggle is None


def test_a_tokenizer_without_a_rust_backend_encodes_and_decodes_alike() -> None:
    fast = _toy.byte_level()
    slow = _toy.byte_level()
    slow._backend = None
    text = "Hello wörld 😀 <|im_end|>"
    assert slow.encode(text) == fast.encode(text)
    ids = fast.encode(text)
    assert slow.decode(ids) == fast.decode(ids)
    assert slow.decode(ids, skip_special_tokens=False) == fast.decode(ids, skip_special_tokens=False)


def test_names() -> None:
    assert _toy.fixture("mistral").name == "mistral"
    assert Tokenizer(_toy.byte_level()._hf, source="org/model").name == "org/model"
    assert Tokenizer(_toy.byte_level()._hf, source="x", name="alias").name == "alias"
