"""A mistyped option of a command names the one it most likely meant:
``--concurency`` → ``unrecognized arguments: --concurency (did you mean --concurrency?)``."""

from __future__ import annotations

import difflib
from argparse import ArgumentParser
from typing import Any

__all__ = ["suggest_options", "with_suggestions"]

#: How close a typo must be to an option to be offered (difflib's ratio).
CUTOFF = 0.75


def with_suggestions(parser: ArgumentParser, message: str) -> str:
    """``message`` (argparse's error) with, for each unrecognised ``--option`` in it,
    the closest option of ``parser`` if one is close enough."""
    _, sep, rest = message.partition("unrecognized arguments: ")
    if not sep:
        return message
    known = sorted(o for o in parser._option_string_actions if o.startswith("--"))
    hints = []
    for word in rest.split():
        name = word.split("=", 1)[0]
        if not name.startswith("--") or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=CUTOFF)
        if close:
            hints.append(f"{name} → {close[0]}" if len(rest.split()) > 1 else close[0])
    if not hints:
        return message
    return f"{message} (did you mean {', '.join(hints)}?)"


def suggest_options(parser: Any) -> Any:
    """Make ``parser``'s errors name the closest option for a mistyped one; returns it."""
    error = parser.error

    def error_with_suggestions(message: str) -> Any:
        return error(with_suggestions(parser, message))

    parser.error = error_with_suggestions
    return parser
