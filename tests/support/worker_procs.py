"""Start and stop real worker subprocesses for the worker tests."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from tests.support.helpers import child_env, wait_for

ATOMIC = "tests.support.worker_handlers.process_atomic"


#: The worker commands (``supervised`` applies to them).
WORKER_COMMANDS = ("taskclaim_worker", "worker")


def unsupervised(args: tuple[str, ...]) -> tuple[str, ...]:
    """``args`` of a worker command with ``--no-supervisor`` added, unless they ask for
    the supervisor (``--processes``, a fleet over several databases) or have it."""
    asks = {"--processes", "-p", "--no-supervisor"}
    if any(a in asks or a.startswith("--processes=") for a in args):
        return args
    if args.count("--database") > 1:
        return args
    return (*args, "--no-supervisor")


class WorkerProc:
    """A ``taskclaim_worker`` (or other command) subprocess with its output in temp files.

    A worker runs as one process with ``--no-supervisor`` unless ``supervised`` (the
    command's default: a supervisor and its one worker process) or ``--processes`` is
    given: most tests signal, stop or kill the worker's own process (``pid``)."""

    def __init__(
        self,
        *args: str,
        command: str = "taskclaim_worker",
        settings: dict[str, Any] | None = None,
        claim_meta: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        supervised: bool = False,
    ) -> None:
        if command in WORKER_COMMANDS and not supervised:
            args = unsupervised(args)
        env = child_env(
            TASKCLAIM_T_SETTINGS=json.dumps(settings or {}),
            TASKCLAIM_T_CLAIMMETA=json.dumps(claim_meta or {}),
            PYTHONUNBUFFERED="1",
            **(env or {}),
        )
        self.out = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by close()
        self.err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.args = args
        self.command = command
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.worker_entry", command, *args],
            env=env,
            stdout=self.out,
            stderr=self.err,
            start_new_session=True,  # a signal to the test runner never reaches it
        )
        self.pid = self.proc.pid

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout=timeout)

    def stdout(self) -> str:
        self.out.seek(0)
        return self.out.read()

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read()

    def stderr_count(self, text: str, n: int, timeout: float = 30) -> int:
        """How many times ``text`` is in stderr, once it is there at least ``n`` times
        (a process may write a line a moment after the effect a test waited for)."""
        wait_for(lambda: self.stderr().count(text) >= n, timeout=timeout, what=f"{n} x {text!r}")
        return self.stderr().count(text)

    def wait_started(self, timeout: float = 30) -> None:
        wait_for(
            lambda: "taskclaim worker" in self.stdout() or not self.alive(),
            timeout=timeout,
            what="worker startup line",
        )
        assert self.alive(), f"worker exited early:\n{self.stdout()}\n{self.stderr()}"

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM and wait; SIGKILL if it does not stop in time.

        A worker is first waited for until it has printed its startup line (printed once
        its signal handlers are in place): a SIGTERM before that would kill it outright."""
        if self.command == "taskclaim_worker" and self.alive():
            wait_for(
                lambda: "taskclaim worker" in self.stdout() or not self.alive(),
                timeout=timeout,
                what="worker startup line before SIGTERM",
            )
        if self.alive():
            self.signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.wait(10)
            raise AssertionError(f"worker did not stop:\n{self.stderr()[-3000:]}") from None

    def kill(self) -> None:
        """SIGKILL the whole process group: a supervisor's children too."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.wait(10)

    def kill_holding(
        self, holding: Callable[[], set[Any]], *, timeout: float = 90, what: str = "claims"
    ) -> set[Any]:
        """SIGKILL the process group at a moment it holds something, and return what it held.

        Reading what a running worker holds and then killing it races the worker: it may
        finish every row in between (then nothing is left held), or commit a new claim
        after the read (then a row is held that the read missed). So: freeze the group
        (SIGSTOP), read; if it holds nothing, thaw it (SIGCONT) and try again until
        ``timeout``; else SIGKILL it and read once more after it is gone, returning both
        reads together (a superset of what it held at its death).
        """

        def frozen_holding() -> set[Any]:
            os.killpg(self.pid, signal.SIGSTOP)
            held = holding()
            if not held:
                os.killpg(self.pid, signal.SIGCONT)
            return held

        held = wait_for(
            frozen_holding, timeout=timeout, interval=0.05, what=f"the victim holding {what}"
        )
        self.kill()
        return held | holding()

    def close(self) -> None:
        self.kill()
        self.out.close()
        self.err.close()


def stop_all(procs: list[WorkerProc]) -> None:
    """Kill whatever is still running and close the output files (test teardown)."""
    for p in procs:
        p.close()


def run_command(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a management command to completion in a subprocess; capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "tests.support.worker_entry", *args],
        env=child_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def kill_repeatedly(
    alive: list[WorkerProc],
    respawn: Callable[[], WorkerProc],
    *,
    seconds: float,
    done: Callable[[], bool],
    seed: int,
    on_kill: Callable[[WorkerProc], None] | None = None,
) -> int:
    """SIGKILL a random process of ``alive`` every 1.5-2.5 s for ``seconds`` (or until
    ``done()``), replacing each with ``respawn()``; ``on_kill(victim)`` runs right after
    each death. Returns how many were killed."""
    rng = random.Random(seed)
    kills = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds and not done():
        next_kill = time.monotonic() + rng.uniform(1.5, 2.5)
        wait_for(lambda t=next_kill: time.monotonic() >= t, timeout=5, interval=0.1,
                 what="next kill")  # fmt: skip
        victim = alive.pop(rng.randrange(len(alive)))
        victim.signal(signal.SIGKILL)
        victim.wait(10)
        kills += 1
        if on_kill is not None:
            on_kill(victim)
        alive.append(respawn())
    return kills
