"""A real PostgreSQL server in a temporary directory, for tests, benches and `make fleet`.

`PostgresServer.start()` runs `initdb` into a fresh temp dir and starts `postgres` on a free
loopback port, its unix socket in the same dir, with fsync off (a test's data need not survive
a power cut, and it makes every commit a few milliseconds cheaper; a committed transaction still
survives a crash of the server itself, which is what the outage tests do). The superuser is `smg`,
with a password, and TCP connections must give it (scram-sha-256), so a wrong password is
refused as it would be in production. PostgreSQL refuses to run as root: when this process is
root, `initdb` and `postgres` run as the `postgres` system user (created by Debian's package),
which owns the temp dir. The server is stopped by its PID (fast shutdown, then SIGKILL of its
process group) by `stop()`, and at interpreter exit as a last resort; `kill()` is `kill -9`.
A stopped server can be started again on the same data and port (an outage test).

Run as a script, it starts one and prints its URL until interrupted:

    python -m tools.servers.postgres
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tools.spawn import free_port

USER = "smg"
PASSWORD = "smg-test-password"
_live: set[PostgresServer] = set()


def binaries() -> Path:
    """The directory holding `initdb` and `postgres`: the newest /usr/lib/postgresql/*/bin
    (Debian's layout), else wherever PATH has them."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres") or shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise RuntimeError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/postgres, no postgres on PATH)")


def _as_user() -> tuple[Callable[[], None] | None, int | None, int | None]:
    """A preexec that drops root to the `postgres` user, and that user's uid and gid (all None when not root)."""
    if os.geteuid() != 0:
        return None, None, None
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError as exc:
        raise RuntimeError("running as root and there is no `postgres` user to run PostgreSQL as") from exc
    uid, gid = entry.pw_uid, entry.pw_gid

    def drop() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return drop, uid, gid


class PostgresServer:
    """One PostgreSQL server in a temp dir (see the module docstring)."""

    def __init__(self, *, port: int | None = None, base: Path | None = None) -> None:
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="smg-pg-", dir=base))
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._bin = binaries()
        self._preexec, uid, gid = _as_user()
        if uid is not None and gid is not None:
            os.chmod(self.dir, 0o700)
            os.chown(self.dir, uid, gid)
        self._initdb()

    # -- URLs ------------------------------------------------------------------------------

    def url(self, database: str = "postgres", *, user: str = USER, password: str = PASSWORD) -> str:
        """A `postgresql://` URL of `database` over TCP on 127.0.0.1."""
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{database}"

    # -- life cycle ------------------------------------------------------------------------

    def _run(self, args: list[str]) -> None:
        done = subprocess.run(
            args, preexec_fn=self._preexec, stdin=subprocess.DEVNULL, capture_output=True, cwd=self.dir, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}):\n{done.stdout.decode()}{done.stderr.decode()}")

    def _initdb(self) -> None:
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._preexec is not None:
            os.chown(pwfile, *_owner(self.dir))
        self._run(
            [
                str(self._bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                f"--pwfile={pwfile}",
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ]
        )
        pwfile.unlink()

    def start(self, timeout: float = 30.0) -> PostgresServer:
        """Start the server and wait until it accepts connections."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        log = open(self.log_path, "ab")  # the child keeps its own copy; ours is closed below
        try:
            self._proc = subprocess.Popen(
                [
                    str(self._bin / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-h",
                    "127.0.0.1",
                    "-k",
                    str(self.dir),
                    "-c",
                    "fsync=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                    "-c",
                    "shared_buffers=64MB",
                ],
                preexec_fn=self._preexec,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,
            )
        finally:
            log.close()
        _live.add(self)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self._proc.returncode}:\n{self.log()[-3000:]}")
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not accept connections within {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.05)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def stop(self, timeout: float = 10.0) -> None:
        """Fast shutdown (SIGINT to the postmaster, by PID), SIGKILL of its group after `timeout`. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid)
                proc.wait(5)
        _killpg(proc.pid)  # backends left behind by a postmaster that died first
        self._proc = None

    def kill(self) -> None:
        """`kill -9` the postmaster and its backends."""
        proc = self._proc
        if proc is None:
            return
        _killpg(proc.pid)
        proc.wait(5)
        self._proc = None

    def close(self) -> None:
        """Stop and delete the temp dir."""
        self.stop()
        _live.discard(self)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # -- databases -------------------------------------------------------------------------

    def create_database(self, name: str) -> str:
        """Create an empty database; its URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting whoever is still connected to it."""
        import psycopg
        from psycopg import sql

        if self.pid is None:
            return
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _owner(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_live):
        server.close()


def main() -> None:
    with PostgresServer() as server:
        print(server.url(), flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
