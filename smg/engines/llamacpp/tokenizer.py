"""A GGUF file's tokenizer as a directory the gateway loads with `--model-path` (no torch).

The vocabulary, merges and special tokens are read from the file's metadata and handed to
transformers' own GGUF tokenizer conversion; then two things it does not do are fixed:

- the pre-tokenizer. llama.cpp splits text with a regex chosen by `tokenizer.ggml.pre`; for the
  types transformers has no entry for, it leaves the GPT-2 split, and digits and runs of
  whitespace come out differently from llama.cpp's (SmolLM2's `smollm`: every digit apart);
- the saved class. transformers 5 writes `tokenizer_class: TokenizersBackend`, which older
  transformers cannot load; `PreTrainedTokenizerFast` loads on both.

The chat template is the file's own, except that a ChatML template that cannot render tool use
is replaced by a tool-aware ChatML one (`templates.py`). `generation_config.json` carries the
end-of-generation ids llama.cpp stops on, and `config.json` the model's context length.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from smg.engines.llamacpp.gguf import ModelFacts, read_metadata
from smg.engines.llamacpp.templates import chatml_with_tools, handles_tools, is_chatml

TemplateChoice = Literal["auto", "gguf", "chatml-tools"]

# llama.cpp's pre-tokenizer types that split every digit apart, then split as GPT-2 does
# (llama-vocab.cpp: STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA).
_DIGITS_THEN_GPT2 = frozenset({"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"})
_TOKENIZER_KEYS = {
    "tokenizer.ggml.model": "tokenizer_type",
    "tokenizer.ggml.pre": "pre_tokenizer_type",
    "tokenizer.ggml.tokens": "tokens",
    "tokenizer.ggml.scores": "scores",
    "tokenizer.ggml.token_type": "token_type",
    "tokenizer.ggml.merges": "merges",
    "tokenizer.ggml.precompiled_charsmap": "precompiled_charsmap",
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
    "tokenizer.ggml.add_space_prefix": "add_prefix_space",
}
_SPECIAL = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def _convert(architecture: str, tokenizer_dict: dict[str, Any]) -> Any:
    """transformers' GGUF conversion: `integrations.gguf` in transformers 5, `integrations.ggml` before."""
    import importlib

    try:
        module = importlib.import_module("transformers.integrations.gguf.gguf_tokenizer_mapping")
    except ImportError:
        module = importlib.import_module("transformers.integrations.ggml")
    backend, _ = module.convert_gguf_tokenizer(architecture, tokenizer_dict)
    return backend


def build_backend(metadata: dict[str, Any]) -> Any:
    """The `tokenizers.Tokenizer` the file's metadata describes, split as llama.cpp splits."""
    from tokenizers import pre_tokenizers

    tokenizer_dict = {name: metadata[key] for key, name in _TOKENIZER_KEYS.items() if key in metadata}
    backend = _convert(str(metadata.get("general.architecture") or ""), tokenizer_dict)
    if tokenizer_dict.get("pre_tokenizer_type") in _DIGITS_THEN_GPT2:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    return backend


def choose_template(facts: ModelFacts, choice: TemplateChoice = "auto") -> str | None:
    """The chat template to ship: the file's, or the tool-aware ChatML one (`auto`: when the
    file's is ChatML and cannot render tool use)."""
    own = facts.chat_template
    if choice == "gguf":
        return own
    if choice == "chatml-tools":
        return chatml_with_tools(own or "")
    if own is not None and is_chatml(own) and not handles_tools(own):
        return chatml_with_tools(own)
    return own


def export_tokenizer(gguf: str | Path, out: str | Path, *, template: TemplateChoice = "auto") -> Path:
    """Write the tokenizer directory of the GGUF file `gguf` to `out` and return `out`."""
    import transformers

    metadata = read_metadata(gguf)
    facts = ModelFacts.of(metadata)
    tokens: list[str] = metadata.get("tokenizer.ggml.tokens") or []
    specials = {
        name: tokens[metadata[key]]
        for name, key in _SPECIAL.items()
        if isinstance(metadata.get(key), int) and 0 <= metadata[key] < len(tokens)
    }
    fast: Any = transformers.PreTrainedTokenizerFast  # loads on transformers 4 and 5 alike
    hf = fast(tokenizer_object=build_backend(metadata), **specials)
    chat_template = choose_template(facts, template)
    if chat_template is not None:
        hf.chat_template = chat_template
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))

    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["add_bos_token"] = bool(metadata.get("tokenizer.ggml.add_bos_token", False))
    config["add_eos_token"] = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    if facts.context_length:
        config["model_max_length"] = facts.context_length
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")

    ids = {"bos_token_id": facts.bos_token_id, "eos_token_id": facts.eos_token_ids, "pad_token_id": facts.pad_token_id}
    generation: dict[str, Any] = {key: value for key, value in ids.items() if value is not None}
    generation.update(facts.sampling_defaults)
    _write_json(out / "generation_config.json", generation)
    model_config: dict[str, Any] = {
        "architectures": facts.architectures,
        "model_type": facts.architecture,
        "vocab_size": facts.vocab_size,
        "max_position_embeddings": facts.context_length,
        **{key: value for key, value in ids.items() if value is not None},
    }
    model_config["eos_token_id"] = facts.eos_token_ids[0] if facts.eos_token_ids else None
    _write_json(out / "config.json", model_config)
    return out


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
