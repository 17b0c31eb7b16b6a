"""Text that is safe to print or log: no credential, no forged line.

:func:`redact` hides the password of every URL or DSN in a text (the userinfo of
``scheme://user:password@host`` and a libpq ``password=…`` pair); every place that
prints or logs a broker URL or a driver's error message (the relay, the worker's log
lines, the doctor) passes it through here. (A user-supplied string, such as a queue
name, a pause reason or an event name, is logged with ``%r``, so that a newline in it
cannot start a line of its own: docs/security.md.)

Ground floor: imports nothing of ours.
"""

from __future__ import annotations

import re

__all__ = ["HIDDEN", "redact", "redact_url"]

#: What a password is replaced with.
HIDDEN = "***"

# ``scheme://user:password@``: the password ends at the last ``@`` before the host (a
# password may hold an ``@`` of its own, percent-encoded or not), never past a ``/``,
# a space or a quote.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s'\"]*:)(?P<secret>[^\s/'\"]*)@")
# ``password=secret`` / ``password = 'se cret'`` in a libpq or ODBC connection string.
_PAIR = re.compile(
    r"(?P<head>\b(?:password|passwd|pwd|sslpassword)\s*=\s*)"
    r"(?P<secret>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s;,]+)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with the password of every URL (``amqp://relay:secret@host`` →
    ``amqp://relay:***@host``) and every ``password=…`` pair replaced by ``***``; the
    rest (user, host, port, path) is kept, for the reader to know which broker or
    database is meant."""
    text = _USERINFO.sub(lambda m: f"{m['head']}{HIDDEN}@", text)
    return _PAIR.sub(lambda m: f"{m['head']}{HIDDEN}", text)


def redact_url(url: str) -> str:
    """``url`` to print: its password, if any, replaced by ``***``."""
    return redact(url)
