"""`make test-vllm`: the real model as a bf16 safetensors directory for vLLM's CPU engine.

vLLM 0.32 has no GGUF loader on the CPU, so transformers (in the vLLM venv, which has torch)
dequantizes the GGUF's weights and saves them as safetensors; the tokenizer files are copied from
the directory `smg engine export-tokenizer` wrote, so vLLM, the llama.cpp engine and the gateway
all tokenize alike. Run with the vLLM venv's python:
``python tools/convert_gguf.py --gguf FILE --tokenizer DIR --out DIR``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    gguf = args.gguf.resolve()
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True),
    )
    # Dequantized, the model is a plain dense one; transformers still refuses to save a model that
    # came through its GGUF quantizer, so it is told the model is no longer quantized.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.is_quantized = False
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix="convert-") as scratch:
        staged = Path(scratch) / "model"
        model.save_pretrained(str(staged), safe_serialization=True)
        for name in TOKENIZER_FILES:
            source = args.tokenizer / name
            if source.is_file():
                shutil.copy(source, staged / name)
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    print(f"converted {gguf.name} to {out}")


if __name__ == "__main__":
    main()
