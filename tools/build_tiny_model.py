"""Builds tiny random model directories for the real-engine tests (``make test-vllm``): a Qwen3, and
with ``--vision`` a Qwen2-VL (a one-block vision tower in front of the same two-layer text model).

The tokenizer, chat template and generation config are copied from the qwen3 fixture
(``tests/fixtures/qwen3``); the model is a seeded, randomly initialised ``Qwen3ForCausalLM`` in
bfloat16, two layers of width 64, whose vocabulary is exactly the fixture tokenizer's, so every id
the gateway sends is in range. Its output is gibberish: good for protocol shape, counts, finish
reasons, stops, errors and aborts, never for text content. The recipe and its measurements are in
../shared/engines/vllm-cpu.md.

The Qwen2-VL takes the fixture tokenizer too (it holds the vision tokens: `<|vision_start|>` 4003,
`<|image_pad|>` 4006) and the image processor settings of the ``qwen2vl`` fixture (at most
12,544 pixels: an image is at most 16 placeholders), so an image costs the CPU engine little.

Needs torch and transformers (the vLLM venv has both); run from the repository root:
``.venv-vllm/bin/python tools/build_tiny_model.py --out .cache/tiny-qwen3``
(``--vision --out .cache/tiny-qwen2vl`` for the vision model).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "qwen3"
VISION_FIXTURE = REPO_ROOT / "tests" / "fixtures" / "qwen2vl"
COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
SEED = 0


def _text_config(fixture: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    fixture_config = json.loads((fixture / "config.json").read_text())
    return {
        "vocab_size": len(AutoTokenizer.from_pretrained(str(fixture))),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "bos_token_id": fixture_config["bos_token_id"],
        "eos_token_id": fixture_config["eos_token_id"],
        "pad_token_id": fixture_config["pad_token_id"],
    }


def _qwen3(fixture: Path) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**_text_config(fixture), head_dim=32, tie_word_embeddings=True, dtype="bfloat16")
    return Qwen3ForCausalLM(config)


def _qwen2vl(fixture: Path, vision_fixture: Path) -> Any:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    vision = json.loads((vision_fixture / "config.json").read_text())
    text = _text_config(fixture)
    # Qwen2-VL's M-RoPE splits each head's 16 rotary pairs over (t, h, w); head_dim = 64 / 2 heads.
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}
    config = Qwen2VLConfig(
        text_config=text,
        vision_config={
            "depth": 1,
            "embed_dim": 32,
            "hidden_size": text["hidden_size"],
            "num_heads": 2,
            "mlp_ratio": 2,
            **vision["vision_config"],
        },
        image_token_id=vision["image_token_id"],
        video_token_id=vision["video_token_id"],
        vision_start_token_id=vision["vision_start_token_id"],
        vision_end_token_id=vision["vision_end_token_id"],
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    return Qwen2VLForConditionalGeneration(config)


def build(
    out: Path, fixture: Path = FIXTURE, seed: int = SEED, *, vision: bool = False, vision_fixture: Path = VISION_FIXTURE
) -> Path:
    """Write the model directory to ``out`` (replacing it) and return it."""
    import torch

    torch.manual_seed(seed)
    model = (_qwen2vl(fixture, vision_fixture) if vision else _qwen3(fixture)).to(torch.bfloat16)
    # Written aside, then swapped in: a half-built directory never looks finished to make.
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.save_pretrained(str(staging))
    for name in COPIED:
        if (fixture / name).is_file():
            shutil.copyfile(fixture / name, staging / name)
    if vision:
        shutil.copyfile(vision_fixture / "preprocessor_config.json", staging / "preprocessor_config.json")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tools/build_tiny_model.py", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / ".cache" / "tiny-qwen3")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--vision", action="store_true", help="a tiny Qwen2-VL instead of the text-only Qwen3")
    args = parser.parse_args(argv)
    out = build(args.out.resolve(), seed=args.seed, vision=args.vision)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"tiny {'Qwen2-VL' if args.vision else 'Qwen3'} model written to {out} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
