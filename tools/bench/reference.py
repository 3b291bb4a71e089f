"""The reference gateway for side-by-side benches: the Rust `smg` wheel from PyPI, installed on
demand into a venv of its own under `.cache/` (or the `smg` executable `SMG_REFERENCE_BIN` names),
started over the same scripted engine as this gateway.

Its `smg launch` also binds a Prometheus port (given a free one here) and ignores the first
SIGTERM, so stopping it sends two before the process-group SIGKILL that `Spawned.stop` ends with.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tools.spawn import REPO_ROOT, Spawned, free_port, spawn

VERSION = "1.13.0"
VENV = REPO_ROOT / ".cache" / f"smg-reference-{VERSION}"


def executable() -> Path:
    """The reference `smg`, installed into `VENV` the first time (pip, from PyPI)."""
    named = os.environ.get("SMG_REFERENCE_BIN")
    if named:
        return Path(named)
    venv = VENV.resolve()  # `.cache` may be a link: scripts must name the real path
    binary = venv / "bin" / "smg"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"smg=={VERSION}"], check=True)
    return binary


def command() -> list[str]:
    """How to run the reference `smg`: a named executable as it is; the installed one through its
    venv's interpreter, so a venv whose scripts name an interpreter path that has since moved
    still runs."""
    binary = executable()
    if os.environ.get("SMG_REFERENCE_BIN"):
        return [str(binary)]
    return [str(binary.parent / "python"), str(binary)]


@dataclass(eq=False)
class Reference(Spawned):
    """A started reference gateway."""

    def stop(self, timeout: float = 5.0) -> None:
        if not self._stopped and self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)  # the first one only starts its graceful drain
            time.sleep(0.2)
        super().stop(timeout)


def spawn_reference(
    worker_urls: list[str], model_path: Path | None = None, parsers: tuple[str, str] | None = None
) -> Reference:
    """The reference gateway on 127.0.0.1 in front of `worker_urls`, ready once `/health`
    answers; gRPC engines need the tokenizer's `model_path`, and get the same `parsers`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [*command(), "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls]
    if model_path is not None:
        args += ["--model-path", str(model_path)]
    if parsers is not None:
        args += ["--tool-call-parser", parsers[0], "--reasoning-parser", parsers[1]]
    args += [
        "--disable-retries",
        "--log-level",
        "warn",
        "--prometheus-port",
        str(free_port()),
    ]
    # An inherited PYTHONPATH pointing at this checkout would shadow the wheel's own `smg` package.
    started = spawn(args, ready_url=f"{url}/health", url=url, timeout=120.0, env={"PYTHONPATH": ""})
    return Reference(started.proc, started.url, started.log_path)
