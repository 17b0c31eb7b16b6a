"""What a lifecycle write carries, shared by the single-row and the batched writes.

The database a claimed instance is written to (:func:`_db`), the check of the result
fields a caller asks to save with a transition (:func:`check_fields`), and the text
stored in ``last_error`` (:func:`format_error`). Used by
:mod:`django_taskclaim.settle.outcome` (which re-exports :func:`format_error` and
:data:`MAX_ERROR_CHARS`) and :mod:`django_taskclaim.settle.batch`.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import router

from django_taskclaim.config.claim_meta import CLAIM_STATE_FIELDS, SLOT_FIELD
from django_taskclaim.config.options import ClaimOptions
from django_taskclaim.row.claimable import Claimable, model_of

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


def check_fields(opts: ClaimOptions, task: Any, fields: Mapping[str, Any]) -> None:
    """Refuse, before anything is written, result fields a transition may not write: the
    primary key (``pk``, its name or column attribute, any primary-key field: the fenced
    UPDATE would move the row), the claim bookkeeping (status, token, lease, holder,
    attempts, ``finished_at``, ``last_error``, the concurrency slot: the transitions set
    them) and names the model does not have. ``ValueError`` naming the field."""
    if not fields:  # the usual result: nothing to check
        return
    meta = task._meta
    pk = meta.pk
    keys = {"pk", pk.name, pk.attname} if pk is not None else {"pk"}
    bookkeeping = CLAIM_STATE_FIELDS | {opts.status_field, SLOT_FIELD}
    for name in fields:
        try:
            field = meta.get_field(name)
        except FieldDoesNotExist:
            field = None
        if name in keys or getattr(field, "primary_key", False):
            raise ValueError(
                f"{name!r} is the primary key of {opts.label}: result fields cannot "
                "change which row a task is; nothing was written"
            )
        if field is not None and field.name in bookkeeping:
            raise ValueError(f"{name!r} is claim bookkeeping; the lifecycle methods set it")
        if name in CLAIM_STATE_FIELDS or name == opts.status_field:
            raise ValueError(f"{name!r} is claim bookkeeping; the lifecycle methods set it")
        if field is None:
            raise ValueError(f"{opts.label} has no field {name!r}")
