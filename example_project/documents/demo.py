"""The demo run: database, admin user, seeded rows, workers, a live progress bar.

Kept apart from the management command so that the command only parses options.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.db.models import Count, Min
from django.utils import timezone

from django_taskclaim.db import DbNow, db_now

from .models import Document, ParserJob
from .seeding import batch_jobs, seed

PROJECT_DIR = Path(__file__).resolve().parent.parent
MANAGE = PROJECT_DIR / "manage.py"


@dataclass
class DemoOptions:
    docs: int = 1000
    jobs: int = 100
    workers: int = 3
    concurrency: int = 4
    batch: int = 4
    timeout: float = 600.0
    seconds: float | None = None
    fail_rate: float | None = None
    var_dir: Path = field(
        default_factory=lambda: Path(os.environ.get("DEMO_VAR_DIR") or PROJECT_DIR / "var")
    )


class Demo:
    """One demo run; ``run()`` returns the process exit code (0 = every document drained)."""

    def __init__(self, options: DemoOptions, out: IO[str]) -> None:
        self.o = options
        self.out = out
        self.tty = out.isatty() if hasattr(out, "isatty") else False
        self.procs: list[subprocess.Popen] = []
        self.reaper: subprocess.Popen | None = None
        self.logs = self.o.var_dir / "logs"

    # -- steps --------------------------------------------------------------------
    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def describe_database(self) -> str:
        conf = settings.DATABASES["default"]
        if conf["ENGINE"].endswith("postgresql") and str(conf.get("HOST", "")).startswith("/"):
            return f"embedded PostgreSQL (data in {conf['HOST']})"
        return f"{connection.vendor} {conf.get('HOST') or conf.get('NAME')}"

    def prepare(self) -> tuple[str, str]:
        """Migrate and make sure the admin user exists; return its credentials."""
        self.o.var_dir.mkdir(parents=True, exist_ok=True)
        self.say(f"database: {self.describe_database()}")
        call_command("migrate", interactive=False, verbosity=0)
        self.say("migrations: applied")
        return self.ensure_admin()

    def ensure_admin(self) -> tuple[str, str]:
        """Create the superuser once; its password comes from the environment or a file."""
        username = os.environ.get("DEMO_ADMIN_USER") or "admin"
        password = os.environ.get("DEMO_ADMIN_PASSWORD") or ""
        stored = self.o.var_dir / "admin-password.txt"
        if not password and stored.exists():
            password = stored.read_text().strip()
        if not password:
            password = secrets.token_urlsafe(9)
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            User.objects.create_superuser(username, f"{username}@example.com", password)
            self.say(f"admin user: created {username!r}")
        elif not user.check_password(password):
            user.set_password(password)
            user.save(update_fields=["password"])
            self.say(f"admin user: {username!r} password updated")
        else:
            self.say(f"admin user: reusing {username!r}")
        if not os.environ.get("DEMO_ADMIN_PASSWORD"):
            stored.write_text(password + "\n")
            stored.chmod(0o600)
        return username, password

    def start_worker(self, index: int) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            str(MANAGE),
            "worker",
            "--burst",
            "--concurrency",
            str(self.o.concurrency),
            "--batch",
            str(self.o.batch),
            "--worker-id",
            f"demo-{os.getpid()}-{index}",
        ]
        return self._spawn(cmd, self.logs / f"worker-{index}.log")

    def _spawn(self, cmd: list[str], log_path: Path) -> subprocess.Popen:
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=PROJECT_DIR)

    def start_reaper(self) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(MANAGE), "reaper", "--interval", "2"]
        return self._spawn(cmd, self.logs / "reaper.log")

    # -- progress -------------------------------------------------------------------
    def counts(self, batch: str) -> dict[str, int]:
        rows = (
            Document.objects.filter(batch=batch).order_by().values("status").annotate(n=Count("pk"))
        )
        return {r["status"]: r["n"] for r in rows}

    def bar(self, c: dict[str, int], total: int, started: float) -> str:
        """The progress line: ``#`` done, ``x`` failed (finished too: the bar is full once
        every row is done, failed or cancelled), ``.`` still to go."""
        done, failed = c.get("done", 0), c.get("failed", 0) + c.get("cancelled", 0)
        width = 30
        finished = min(done + failed, total)
        filled = width * finished // total if total else width
        d = min(width * done // total if total else 0, filled)
        f = filled - d
        elapsed = time.monotonic() - started
        rate = (done + failed) / elapsed if elapsed > 0 else 0.0
        return (
            f"[{'#' * d}{'x' * f}{'.' * (width - filled)}] "
            f"{done + failed}/{total}  done {done}  failed {failed}  "
            f"processing {c.get('processing', 0)}  {elapsed:5.1f}s  {rate:6.1f}/s"
        )

    def retries_waiting(self, batch: str) -> tuple[int, float]:
        """``(rows, seconds)``: how many rows of ``batch`` wait for a retry that is not
        due yet, and in how many seconds the first is due, on the database clock;
        ``(0, 0.0)`` while any row of the batch can be claimed now (the workers are not
        waiting). Parser jobs have no ``run_after`` column: they are retried at once."""
        documents = Document.objects.filter(batch=batch)
        if documents.claimable().exists() or batch_jobs(batch).claimable().exists():
            return 0, 0.0
        waiting = documents.ready().filter(run_after__gt=DbNow())
        found = waiting.aggregate(rows=Count("pk"), first=Min("run_after"))
        if not found["rows"]:
            return 0, 0.0
        return found["rows"], max(0.0, (found["first"] - db_now()).total_seconds())

    def status_line(self, batch: str, total: int, started: float) -> tuple[str, dict[str, int]]:
        """The progress line of ``batch`` and its counts; while every open row waits for
        a retry, the line says how many and when the first is due."""
        c = self.counts(batch)
        line = self.bar(c, total, started)
        rows, due = self.retries_waiting(batch)
        if rows:
            plural = "retry" if rows == 1 else "retries"
            line += f"  waiting for {rows} {plural} due in {due:.1f} s"
        return line, c

    def starting_text(self) -> str:
        """What the progress line says until the first worker claims a row."""
        n = self.o.workers
        return f"starting {n} worker{'s' if n != 1 else ''} (loading Django, connecting)…"

    def new_batch(self) -> str:
        """A batch name no earlier run used (two runs within one second get a suffix)."""
        batch = timezone.now().strftime("run-%Y%m%d-%H%M%S")
        if Document.objects.filter(batch=batch).exists() or batch_jobs(batch).exists():
            batch = f"{batch}-{secrets.token_hex(2)}"
        return batch

    def run(self) -> int:
        username, password = self.prepare()
        batch = self.new_batch()
        docs, jobs = seed(
            self.o.docs,
            batch=batch,
            jobs=self.o.jobs,
            seconds=self.o.seconds,
            fail_rate=self.o.fail_rate,
        )
        self.say(f"seeded: {docs} documents and {jobs} parser jobs (batch {batch})")
        self.say(
            f"workers: {self.o.workers} processes x {self.o.concurrency} threads "
            f"(manage.py worker --burst), plus the reaper; logs in {self.logs}"
        )
        started = time.monotonic()
        deadline = started + self.o.timeout
        self.reaper = self.start_reaper()
        self.procs = [self.start_worker(i + 1) for i in range(self.o.workers)]
        rounds = 1
        last_line = 0.0
        was_waiting = False
        starting: dict[str, int] | None = None  # the counts when a new round started
        booting = True  # until the first round's workers claim a row
        code = 0
        try:
            while True:
                line, c = self.status_line(batch, docs, started)
                if starting is not None and (c.get("processing") or c != starting):
                    starting = None  # the new round has claimed rows
                if starting is not None and "waiting for" not in line:
                    line += f"  retries due: starting worker round {rounds}"
                if booting and any(c.get(s) for s in ("processing", "done", "failed", "cancelled")):
                    booting = False
                if booting:
                    # each worker loads Python and Django and connects before its first
                    # claim: seconds on a small machine, with nothing to show meanwhile
                    line += f"  {self.starting_text()}"
                waiting = "waiting for" in line or "starting worker round" in line or booting
                if self.tty:
                    self.out.write("\r" + line + "\x1b[K")  # erase what a longer line left
                    self.out.flush()
                elif time.monotonic() - last_line > 2 or waiting != was_waiting:
                    self.say(line)  # every two seconds, and when a wait starts or ends
                    last_line = time.monotonic()
                was_waiting = waiting
                open_rows = c.get("ready", 0) + c.get("processing", 0)
                jobs_open = (
                    batch_jobs(batch).filter(status__in=[ParserJob.NEW, ParserJob.PENDING]).exists()
                )
                if not open_rows and not jobs_open:
                    break
                if time.monotonic() > deadline:
                    self.say(
                        f"\ntimeout: {open_rows} documents still open after {self.o.timeout:g}s"
                    )
                    code = 1
                    break
                running = [p for p in self.procs if p.poll() is None]
                crashed = [p for p in self.procs if p.poll() not in (None, 0)]
                if crashed:
                    self.say(
                        f"\na worker exited with code {crashed[0].returncode}; see {self.logs}"
                    )
                    code = 1
                    break
                if not running and (
                    Document.objects.claimable().exists() or ParserJob.objects.claimable().exists()
                ):
                    # Burst workers drained what was ready; retries deferred by backoff
                    # became ready since: start another round.
                    rounds += 1
                    self.procs = [self.start_worker(i + 1) for i in range(self.o.workers)]
                    starting = c
                time.sleep(0.2)
        finally:
            self.stop()
        # The last progress line shows the final counts, on a terminal or not (a line
        # printed every two seconds would otherwise end short of them).
        final = self.bar(self.counts(batch), docs, started)
        if self.tty:
            self.out.write("\r" + final + "\x1b[K\n")
            self.out.flush()
        else:
            self.say(final)
        self.summary(batch, docs, started, rounds)
        self.say("")
        self.say("Open the admin:  make serve   then  http://127.0.0.1:8000/admin/")
        self.say(f"                 user {username!r}  password {password!r}")
        self.still_running()
        return code

    def still_running(self) -> None:
        """Say what this run leaves behind and how to stop it."""
        self.say("")
        self.say("workers and reaper: stopped")
        pg_dir = getattr(settings, "EMBEDDED_PG_DIR", None)
        if not pg_dir:
            self.say(f"database: {self.describe_database()} (not started by the demo; left as is)")
            return
        conf = settings.DATABASES["default"]
        pid = ""
        pidfile = Path(pg_dir) / "postmaster.pid"
        if pidfile.exists():
            pid = f", pid {pidfile.read_text().split()[0]}"
        host, port = str(conf.get("HOST", "")), conf.get("PORT") or "5432"
        where = (
            f"Unix socket {host}/.s.PGSQL.{port}, no TCP port"
            if host.startswith("/")
            else f"{host or 'localhost'}:{port}"
        )
        self.say(
            f"still running: the embedded PostgreSQL (data dir {pg_dir}, {where}{pid}); "
            "the next run reuses it"
        )
        default = (PROJECT_DIR / "var" / "pg").resolve()
        if Path(pg_dir).resolve() == default:
            self.say("stop it with:  make clean-db   (or scripts/demo.sh stop)")
        else:
            self.say(f"stop it with:  EMBEDDED_PG_DIR={pg_dir} make clean-db")

    def stop(self) -> None:
        for proc in [*self.procs, *([self.reaper] if self.reaper else [])]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.procs, *([self.reaper] if self.reaper else [])]:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    def summary(self, batch: str, docs: int, started: float, rounds: int) -> None:
        c = self.counts(batch)
        elapsed = time.monotonic() - started
        retried = Document.objects.filter(batch=batch, attempts__gt=1).count()
        self.say("")
        self.say(f"summary of batch {batch}:")
        self.say(f"  documents   {docs}")
        for state in ("done", "failed", "ready", "processing", "cancelled"):
            if c.get(state):
                self.say(f"  {state:<11} {c[state]}")
        self.say(f"  retried     {retried} (succeeded or failed after more than one attempt)")
        jobs = dict(
            batch_jobs(batch)
            .order_by()
            .values_list("status")
            .annotate(n=Count("pk"))
            .values_list("status", "n")
        )
        names = {
            ParserJob.SUCCESS: "success",
            ParserJob.FAILED: "failed",
            ParserJob.NEW: "new",
            ParserJob.PENDING: "pending",
        }
        self.say(
            "  parser jobs "
            + (", ".join(f"{names.get(k, k)} {v}" for k, v in sorted(jobs.items())) or "none")
        )
        rate = docs / elapsed if elapsed else 0
        self.say(f"  time        {elapsed:.1f}s ({rate:.0f} documents/s, {rounds} worker round(s))")
        drained = not (c.get("ready") or c.get("processing"))
        self.say(
            f"  drained     {'yes, every document reached done or failed' if drained else 'NO'}"
        )
