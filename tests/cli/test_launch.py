"""`smg launch` refuses what it cannot do, by name, before it binds a port."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from smg.cli.main import app, expand_multi_values
from smg.cli.options import build_component
from smg.fetch import FetchConfig

runner = CliRunner()
EXAMPLE_LIMITS = Path(__file__).resolve().parents[1] / "admission" / "limits-example.yaml"


def test_multi_value_flags_take_several_values_after_one_flag() -> None:
    argv = ["launch", "--worker-urls", "http://a", "http://b", "--port", "1", "--model-alias", "x=y", "p=q"]
    assert expand_multi_values(argv) == [
        "launch",
        "--worker-urls",
        "http://a",
        "--worker-urls",
        "http://b",
        "--port",
        "1",
        "--model-alias",
        "x=y",
        "--model-alias",
        "p=q",
    ]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--worker-urls", "http://127.0.0.1:1", "--pd-disaggregation"], "needs at least one --prefill URL"),
        (["--epd-disaggregation", "--prefill", "grpc://a:1", "--decode", "grpc://b:1"], "at least one --encode"),
        (["--pd-disaggregation", "--encode", "grpc://e:1", "--prefill", "grpc://a:1", "--decode", "grpc://b:1"],
         "--encode needs --epd-disaggregation"),
        (["--pd-disaggregation", "--epd-disaggregation", "--prefill", "grpc://a:1", "--decode", "grpc://b:1"],
         "two modes"),
        (["--pd-disaggregation", "--prefill", "grpc://a:1", "--decode", "http://b:1"], "use one connection"),
        (["--epd-disaggregation", "--encode", "http://e:1", "--prefill", "http://a:1", "--decode", "http://b:1"],
         "grpc:// workers (TokenSpeed) only"),
        (["--epd-disaggregation", "--backend", "sglang", "--encode", "grpc://e:1", "--prefill", "grpc://a:1",
          "--decode", "grpc://b:1"], "serves TokenSpeed workers"),
        (["--epd-disaggregation", "--encode", "grpc://e:1 x", "--prefill", "grpc://a:1", "--decode", "grpc://b:1"],
         "--encode takes URL [BOOTSTRAP_PORT]"),
        (["--worker-urls", "http://127.0.0.1:1", "--policy", "bogus"], "--policy must be one of"),
        (["--worker-urls", "http://127.0.0.1:1", "--no-such-flag"], "no such option: --no-such-flag"),
        ([], "--worker-urls is required"),
        (["--worker-urls", "grpc://127.0.0.1:1", "--backend", "anthropic"], "cannot serve grpc:// workers"),
        (["--worker-urls", "grpc://127.0.0.1:1", "--chat-template", "/nonexistent.jinja"], "no such file"),
        (["--worker-urls", "grpc://127.0.0.1:1", "--worker-urls", "http://127.0.0.1:2"], "needs IGW mode"),
        (["--worker-urls", "ipc:///tmp/x"], "ipc:// (ZMQ) workers need --backend vllm or tokenspeed"),
        (["--worker-urls", "ipc:///tmp/x", "--backend", "vllm"], "need --model-path"),
        (["--worker-urls", "ipc:///tmp/x", "--backend", "sglang", "--model-path", "m"], "cannot serve ipc://"),
        (
            ["--worker-urls", "ipc:///tmp/x", "--backend", "vllm", "--model-path", "m", "--zmq-engine-count", "0"],
            "--zmq-engine-count must be at least 1",
        ),
        (["--worker-urls", "ipc:///tmp/x", "--worker-urls", "grpc://127.0.0.1:1", "--backend", "vllm",
          "--model-path", "m"], "needs IGW mode"),
        (["--worker-urls", "ftp://x"], "unsupported worker URL scheme"),
        (["--worker-urls", "http://127.0.0.1:1", "--model-alias", "nope"], "ALIAS=CANONICAL"),
        (["--worker-urls", "http://127.0.0.1:1", "--backend", "bogus"], "unknown --backend"),
        (["--worker-urls", "http://127.0.0.1:1", "--log-level", "loud"], "--log-level"),
        (["--worker-urls", "http://127.0.0.1:1", "--rate-limit-tokens-per-second", "5"], "refilling admission"),
        (["--worker-urls", "http://127.0.0.1:1", "--tenant-api-key", "nocolon"], "expected TENANT:KEY"),
        (["--worker-urls", "http://127.0.0.1:1", "--tenant-rate-limit-enabled"], "needs --tenant-rate-limit-config"),
        (
            ["--worker-urls", "http://127.0.0.1:1", "--tenant-rate-limit-enabled", "--tenant-rate-limit-config", "/no"],
            "reading /no",
        ),
        (
            [
                "--worker-urls",
                "http://127.0.0.1:1",
                "--tenant-rate-limit-enabled",
                "--tenant-rate-limit-config",
                str(EXAMPLE_LIMITS),
                "--price-table",
                str(EXAMPLE_LIMITS.with_name("prices-example.toml")),
                "--tenant-rate-limit-state",
                "/no/such/dir/state.db",
            ],
            "unable to open",
        ),
        (
            ["--worker-urls", "http://127.0.0.1:1", "--max-concurrent-requests", "2", "--queue-timeout-secs", "0"],
            "--queue-timeout-secs must be > 0",
        ),
        (["--worker-urls", "http://127.0.0.1:1", "--prometheus-duration-buckets", "1", "x"], "takes numbers"),
        (["--worker-urls", "http://127.0.0.1:1", "--prometheus-duration-buckets", "2", "1"], "increasing"),
        (["--worker-urls", "http://127.0.0.1:1", "--prometheus-port", "70000"], "--prometheus-port must be"),
        (["--worker-urls", "http://127.0.0.1:1", "--enable-trace", "--otlp-traces-endpoint", "nohost"], "HOST:PORT"),
        (["--worker-urls", "http://127.0.0.1:1", "--fetch-allow", "10.0.0.0/8", "localhost"], "takes CIDR ranges"),
        (["--worker-urls", "http://127.0.0.1:1", "--media-max-items", "0"], "--media-max-items"),
        (["--worker-urls", "http://127.0.0.1:1", "--mm-per-request-image-limit", "many"], "takes a count"),
    ],
)
def test_launch_refuses_clearly(args: list[str], needle: str) -> None:
    result = runner.invoke(app, expand_multi_values(["launch", *args]))  # as `smg` itself parses argv
    assert result.exit_code != 0
    assert needle in result.output


def test_fetch_allow_takes_several_ranges_after_one_flag_or_repeated() -> None:
    argv = ["launch", "--fetch-allow", "10.0.0.0/8", "fd00::/8", "--fetch-allow", "127.0.0.1"]
    expanded = expand_multi_values(argv)
    assert expanded[1::2] == ["--fetch-allow"] * 3
    policy = build_component(FetchConfig, {"fetch_allow": expanded[2::2]}).policy()
    assert [str(n) for n in policy.allow] == ["10.0.0.0/8", "fd00::/8", "127.0.0.1/32"]


def test_console_entry_point_shows_every_command() -> None:
    out = subprocess.run([sys.executable, "-m", "smg", "--help"], capture_output=True, text=True, check=True).stdout
    assert "launch" in out and "journal" in out


@pytest.mark.parametrize("where", ["proc", "under-a-file"])
def test_a_journal_that_cannot_be_written_is_one_line_naming_it_and_exit_2(tmp_path: Path, where: str) -> None:
    # /proc takes no new files, even from root; a path under a regular file has no directory.
    if where == "proc":
        journal = Path("/proc/smg-journal-test.db")
    else:
        (tmp_path / "a-file").write_text("")
        journal = tmp_path / "a-file" / "journal.db"
    done = subprocess.run(
        [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", "1", "--journal", str(journal),
         "--worker-urls", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("smg launch:")]
    assert len(errors) == 1 and str(journal) in errors[0], done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 3, done.stderr


def test_a_journal_whose_writers_cannot_register_is_one_line_and_exit_2(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    (tmp_path / ".journal.db.writers").write_text("")  # where the live writers' lock files go
    done = subprocess.run(
        [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", "1", "--journal", str(journal),
         "--worker-urls", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("smg launch:")]
    assert len(errors) == 1 and str(journal) in errors[0] and "live writer" in errors[0], done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_a_journal_migrated_at_launch_says_how_its_rollups_are_counted(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    fixture = Path(__file__).parent.parent / "journal" / "data" / "journal-v7.db.gz"
    journal.write_bytes(gzip.decompress(fixture.read_bytes()))  # 200 requests, schema 7
    (tmp_path / ".journal.db.writers").write_text("")  # stops the launch right after the migration
    done = subprocess.run(
        [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", "1", "--journal", str(journal),
         "--worker-urls", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert f"smg: migrating {journal}: counting 200 requests into the rollups" in lines, done.stderr
    assert any(line.startswith(f"smg: migrated {journal}: 200 requests counted in ") for line in lines), done.stderr
