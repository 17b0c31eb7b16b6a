"""What a lifecycle write carries, shared by the single-row and the batched writes.

The database a claimed instance is written to (:func:`_db`), the check of the result
fields a caller asks to save with a transition (:func:`_check_fields`), and the text
stored in ``last_error`` (:func:`format_error`). Used by
:mod:`django_taskclaim.settle.outcome` (which re-exports :func:`format_error` and
:data:`MAX_ERROR_CHARS`) and :mod:`django_taskclaim.settle.batch`.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import Any

from django.db import router

from django_taskclaim.config.options import CLAIM_STATE_FIELDS, ClaimOptions
from django_taskclaim.model.claimable import Claimable, model_of

MAX_ERROR_CHARS = 10_000


def storable_text(text: str) -> str:
    """``text`` with what no database text column accepts escaped: NUL characters and
    lone surrogates (``\\x00``, ``\\ud800``). An error about a value that could not be
    stored quotes that value: its message must still be storable."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def format_error(error: BaseException | str) -> str:
    """Text stored in ``last_error``: the traceback of an exception, or the string;
    always storable (:func:`storable_text`)."""
    if isinstance(error, BaseException):
        text = "".join(traceback.format_exception(error)).strip()
    else:
        text = str(error)
    text = storable_text(text)
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS // 2] + "\n…\n" + text[-MAX_ERROR_CHARS // 2 :]
    return text


def _db(task: Claimable) -> str:
    return task._state.db or router.db_for_write(model_of(task), instance=task)


def _check_fields(opts: ClaimOptions, task: Claimable, fields: Mapping[str, Any]) -> None:
    protected = CLAIM_STATE_FIELDS | {opts.status_field}
    for name in fields:
        if name in protected:
            raise ValueError(f"{name!r} is claim bookkeeping; the lifecycle methods set it")
        try:
            task._meta.get_field(name)
        except Exception:
            raise ValueError(f"{opts.label} has no field {name!r}") from None
