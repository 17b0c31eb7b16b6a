"""A real pgBouncer for tests: started on a free loopback port, in transaction pooling.

``run_pgbouncer(settings_dict, databases)`` writes an ini and a userlist into a temporary
directory, starts ``pgbouncer`` in front of the PostgreSQL server the test run uses (TCP
or the Unix socket directory of the embedded server), waits until it accepts
connections and yields its port. ``databases`` maps a pgBouncer database name to
``(server database name, pool size)``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.helpers import wait_for

CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer")


def binary() -> str | None:
    """Path of the pgbouncer executable, or None."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((c for c in CANDIDATES if os.access(c, os.X_OK)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def run_pgbouncer(
    settings_dict: dict[str, Any], databases: dict[str, tuple[str, int]]
) -> Iterator[int]:
    """Run pgBouncer (``pool_mode = transaction``) for the duration of the block."""
    exe = binary()
    if exe is None:
        raise FileNotFoundError("pgbouncer is not installed (Debian package 'pgbouncer')")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = int(settings_dict.get("PORT") or 5432)
    user = settings_dict.get("USER") or "postgres"
    password = settings_dict.get("PASSWORD") or ""
    with tempfile.TemporaryDirectory(prefix="taskclaim-pgbouncer-") as tmp:
        work = Path(tmp)
        listen = free_port()
        lines = ["[databases]"]
        for name, (dbname, pool_size) in databases.items():
            lines.append(
                f"{name} = host={host} port={port} dbname={dbname} user={user}"
                + (f" password={password}" if password else "")
                + f" pool_size={pool_size}"
            )
        lines += [
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {listen}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {work / 'userlist.txt'}",
            "pool_mode = transaction",
            "max_client_conn = 200",
            "default_pool_size = 4",
            "server_reset_query =",
            "ignore_startup_parameters = extra_float_digits,options",
            f"admin_users = {user}",
            f"logfile = {work / 'pgbouncer.log'}",
            f"pidfile = {work / 'pgbouncer.pid'}",
        ]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            # A Unix-socket server (the embedded one) keeps its socket in a private
            # directory: run as that directory's owner; else as nobody.
            if host.startswith("/"):
                account = pwd.getpwuid(os.stat(host).st_uid)
            else:
                account = pwd.getpwnam("nobody")
            lines.append(f"user = {account.pw_name}")
            os.chown(work, account.pw_uid, account.pw_gid)
        (work / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        (work / "userlist.txt").write_text(f'"{user}" "{password}"\n')
        for f in work.iterdir():
            f.chmod(0o644)
        proc = subprocess.Popen(
            [exe, str(work / "pgbouncer.ini")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_for(
                lambda: proc.poll() is not None or _accepts(listen),
                timeout=20,
                what="pgbouncer to listen",
            )
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                log = work / "pgbouncer.log"
                raise RuntimeError(
                    f"pgbouncer exited with {proc.returncode}: {out}"
                    + (log.read_text() if log.exists() else "")
                )
            yield listen
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout:
                proc.stdout.close()


def transactions_served(port: int, dbname: str, user: str = "postgres") -> int:
    """``total_xact_count`` of ``dbname`` from the admin console's ``SHOW STATS``."""
    import psycopg

    with psycopg.connect(
        host="127.0.0.1",
        port=port,
        dbname="pgbouncer",
        user=user,
        autocommit=True,
        cursor_factory=psycopg.ClientCursor,  # the console speaks the simple protocol
    ) as admin:
        cur = admin.cursor()
        cur.execute("SHOW STATS")
        names = [d.name for d in cur.description or ()]
        for row in cur.fetchall():
            stats = dict(zip(names, row, strict=True))
            if stats["database"] == dbname:
                return int(stats["total_xact_count"])
    return 0
