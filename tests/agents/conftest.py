"""Real agents against the gateway's gRPC path: the agent's CLI, a gateway and a scripted engine.

Claude Code comes from npm (`@anthropic-ai/claude-code`, pinned to `CLAUDE_CODE_VERSION`, or the
version in `SMG_CLAUDE_CODE_VERSION`), installed on first use into the git-ignored
`.cache/node/` and reused afterwards. `SMG_CLAUDE_CODE_BIN` names an already installed `claude`
instead. Where npm or node is missing, or the package cannot be installed or run, the tests
that need it are skipped and say why.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.engine_control import EngineControl
from tools.spawn import REPO_ROOT, Spawned, spawn_engine, spawn_gateway

QWEN3 = REPO_ROOT / "tests" / "fixtures" / "qwen3"
MODEL = "qwen3-fixture"
# Claude Code's system prompt and tool definitions alone are ~24k tokens of the fixture tokenizer.
WINDOW = 200_000

CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"
CLAUDE_CODE_VERSION = os.environ.get("SMG_CLAUDE_CODE_VERSION", "2.1.332")
NODE_DIR = REPO_ROOT / ".cache" / "node"
INSTALL_TIMEOUT = 600.0


def _installed_version() -> str | None:
    manifest = NODE_DIR / "node_modules" / CLAUDE_CODE_PACKAGE / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def _npm_install() -> None:
    """Install the pinned Claude Code into NODE_DIR (one installer at a time); skip if it fails."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip(f"Claude Code needs npm and node on PATH (npm: {npm}, node: {node})")
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    with open(NODE_DIR / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed_version() == CLAUDE_CODE_VERSION:
            return  # another session installed it while this one waited
        args = [
            npm,
            "install",
            "--prefix",
            str(NODE_DIR),
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--loglevel=error",
            f"{CLAUDE_CODE_PACKAGE}@{CLAUDE_CODE_VERSION}",
        ]
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, cwd=NODE_DIR)
        except subprocess.TimeoutExpired:
            pytest.skip(f"`npm install {CLAUDE_CODE_PACKAGE}@{CLAUDE_CODE_VERSION}` took over {INSTALL_TIMEOUT:.0f}s")
        if done.returncode != 0 or _installed_version() != CLAUDE_CODE_VERSION:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            pytest.skip(
                f"cannot install {CLAUDE_CODE_PACKAGE}@{CLAUDE_CODE_VERSION} with npm (exit {done.returncode}):\n{tail}"
            )


def _runs(argv: list[str]) -> str | None:
    """`argv --version`'s output when it runs, else None."""
    with tempfile.TemporaryDirectory(prefix="smg-claude-home-") as home:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": home, "DISABLE_AUTOUPDATER": "1"}
        try:
            done = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60, env=env)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return done.stdout.strip() if done.returncode == 0 else None


def _claude_code_argv() -> list[str]:
    """The command that starts the pinned Claude Code, installing it first if needed."""
    if os.environ.get("SMG_CLAUDE_CODE_BIN"):
        argv = [os.environ["SMG_CLAUDE_CODE_BIN"]]
        if _runs(argv) is None:
            pytest.fail(f"SMG_CLAUDE_CODE_BIN={argv[0]} does not run `--version`")
        return argv
    if _installed_version() != CLAUDE_CODE_VERSION:
        _npm_install()
    modules = NODE_DIR / "node_modules"
    # The package's postinstall puts the native binary in place of its bin stub; where install
    # scripts did not run, the platform package's binary, or the package's node launcher, works.
    candidates = [[str(modules / ".bin" / "claude")]]
    candidates += [[str(p)] for p in sorted(modules.glob(f"{CLAUDE_CODE_PACKAGE}-*/claude"))]
    node = shutil.which("node")
    if node is not None:
        candidates.append([node, str(modules / CLAUDE_CODE_PACKAGE / "cli-wrapper.cjs")])
    for argv in candidates:
        version = _runs(argv)
        if version is not None and version.startswith(CLAUDE_CODE_VERSION):
            return argv
    pytest.skip(f"{CLAUDE_CODE_PACKAGE}@{CLAUDE_CODE_VERSION} is installed in {NODE_DIR} but does not run here")


@pytest.fixture(scope="session")
def claude_code() -> list[str]:
    """The argv prefix that runs Claude Code (skips the test where it cannot be installed)."""
    return _claude_code_argv()


@pytest.fixture(scope="module")
def agent_engine() -> Iterator[Spawned]:
    proc = spawn_engine(
        "sglang",
        model_path=QWEN3,
        extra=["--served-model-name", MODEL, "--max-context-length", str(WINDOW)],
    )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def agent_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("agent-journal") / "smg-journal.db"


@pytest.fixture(scope="module")
def agent_gateway(agent_engine: Spawned, agent_journal: Path) -> Iterator[Spawned]:
    # The tool-call parser is detected from the model id (`qwen3-fixture`: Hermes-style
    # `<tool_call>` JSON, as the Qwen3 chat template asks for).
    proc = spawn_gateway([agent_engine.url], journal=agent_journal, extra=["--model-path", str(QWEN3)])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def agent_control(agent_engine: Spawned) -> Iterator[EngineControl]:
    ctl = EngineControl(agent_engine.url)
    ctl.reset()
    try:
        yield ctl
    finally:
        ctl.reset()
        ctl.close()
