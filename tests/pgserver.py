"""A real PostgreSQL server for tests: Debian's binaries, data in a temp dir, listening on 127.0.0.1 only.

PostgreSQL refuses to run as root; as root (CI, this machine) the server runs as the ``postgres`` user
that Debian's package creates. ``.ci/run`` installs the package on a fresh machine.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def pg_bin() -> Path | None:
    """The folder of initdb/pg_ctl/createdb: Debian's /usr/lib/postgresql/<version>/bin (the newest), else
    where initdb on PATH really lives."""
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if versions:
        return Path(versions[-1]).parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """``with PostgresServer(tmp) as pg: pg.url`` — a fresh cluster, one database, stopped and removed on exit."""

    def __init__(self, root: Path | None = None, database: str | None = "kernsearch",
                 superuser: str = "kernsearch") -> None:
        """``database`` None: none is created; ``superuser``: the cluster's (its password is ``farm-secret``)."""
        # Its own temp folder by default: pytest deletes old basetemp folders of other sessions, and a
        # server whose data folder vanished could no longer be stopped by pg_ctl.
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="kernsearch-pg-"))
        self._owned = root is None
        self.pid: int | None = None
        self.database = database
        self.superuser = superuser
        self.port = _free_port()
        self.bin = pg_bin()
        if self.bin is None:
            raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
        self.data = self.root / "pgdata"
        self.user = "postgres" if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql://{self.superuser}:farm-secret@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True, cwd="/")

    def __enter__(self) -> PostgresServer:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chmod(self.root, 0o755)
            for parent in list(self.root.parents)[:-1]:  # the server user must reach its data folder
                os.chmod(parent, os.stat(parent).st_mode | 0o001)
            self.data.mkdir()
            os.chown(self.data, entry.pw_uid, entry.pw_gid)
        pwfile = self.root / "pw"
        pwfile.write_text("farm-secret\n")
        os.chmod(pwfile, 0o644)
        self._run("initdb", "-D", str(self.data), "-U", self.superuser, "--auth=scram-sha-256", f"--pwfile={pwfile}",
                  "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        log = self.data / "server.log"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(log), "-w", "-t", "60", "start", "-o",
                  f"-h 127.0.0.1 -p {self.port} -k '' -c max_connections=200 -c fsync=off", timeout=90)
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        try:
            env = dict(os.environ, PGPASSWORD="farm-secret")
            if self.database is not None:
                subprocess.run([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
                                self.superuser, self.database], check=True, env=env, capture_output=True, timeout=60)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster, which pg_ctl would send), waiting until it is gone."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            else:
                if not wait_for(lambda: not _alive(self.pid), 60):  # type: ignore[arg-type]
                    os.kill(self.pid, signal.SIGKILL)  # type: ignore[arg-type]
            self.pid = None
        if self._owned:
            shutil.rmtree(self.root, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def running(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return True


def wait_for(predicate, timeout: float, every: float = 0.2) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return bool(predicate())
