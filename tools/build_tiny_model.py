"""Builds a tiny random Qwen3 model directory for the real-engine tests (``make test-vllm``).

The tokenizer, chat template and generation config are copied from the qwen3 fixture
(``tests/fixtures/qwen3``); the model is a seeded, randomly initialised ``Qwen3ForCausalLM`` in
bfloat16, two layers of width 64, whose vocabulary is exactly the fixture tokenizer's, so every id
the gateway sends is in range. Its output is gibberish: good for protocol shape, counts, finish
reasons, stops, errors and aborts, never for text content. The recipe and its measurements are in
../shared/engines/vllm-cpu.md.

Needs torch and transformers (the vLLM venv has both); run from the repository root:
``.venv-vllm/bin/python tools/build_tiny_model.py --out .cache/tiny-qwen3``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "qwen3"
COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
SEED = 0


def build(out: Path, fixture: Path = FIXTURE, seed: int = SEED) -> Path:
    """Write the model directory to ``out`` (replacing it) and return it."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    fixture_config = json.loads((fixture / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(fixture))
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=4096,
        bos_token_id=fixture_config["bos_token_id"],
        eos_token_id=fixture_config["eos_token_id"],
        pad_token_id=fixture_config["pad_token_id"],
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    # Written aside, then swapped in: a half-built directory never looks finished to make.
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.save_pretrained(str(staging))
    for name in COPIED:
        if (fixture / name).is_file():
            shutil.copyfile(fixture / name, staging / name)
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tools/build_tiny_model.py", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / ".cache" / "tiny-qwen3")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    out = build(args.out.resolve(), seed=args.seed)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"tiny Qwen3 model written to {out} ({size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
