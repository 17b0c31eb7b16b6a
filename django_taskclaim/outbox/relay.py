"""The relay: claims outbox rows per partition, publishes them, completes them fenced.

The holder of a partition (:mod:`.partitions`: which partitions this relay holds, by
lease, and the takeover of a dead holder's) claims the partition's ready rows in ``id``
order, publishes them in rounds of at most one message per key (a round starts only once
the broker confirmed the previous one, through a :mod:`.publisher`), and marks the
confirmed rows ``done`` with one fenced UPDATE
(:func:`~django_taskclaim.settle.batch.complete_many`). Its arguments are validated
against :data:`~django_taskclaim.outbox.options.RELAY_OPTIONS`.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, close_old_connections, router
from django.db.models import Min

from django_taskclaim.db import default_worker_id
from django_taskclaim.exceptions import ClaimLost
from django_taskclaim.outbox.models import OutboxMessage
from django_taskclaim.outbox.options import validate
from django_taskclaim.outbox.partitions import PartitionHolder
from django_taskclaim.outbox.publisher import MessagesRejected, Publisher, PublishError
from django_taskclaim.outbox.write import outbox_model
from django_taskclaim.redact import redact
from django_taskclaim.settle.batch import complete_many
from django_taskclaim.settle.transitions import fail, release

logger = logging.getLogger("django_taskclaim.outbox")

#: Failures in a row after which a message that fails on its own (the publisher's
#: ``PublishError.errors``: the broker stayed reachable) is marked ``failed``.
MESSAGE_ATTEMPTS = 5


def rounds(messages: Sequence[Any]) -> list[list[Any]]:
    """Split messages (in ``id`` order) into rounds with at most one message per key,
    keeping each key's messages in order: round ``i`` holds each key's ``i``-th message."""
    seen: dict[str, int] = {}
    out: list[list[Any]] = []
    for message in messages:
        i = seen.get(message.key, 0)
        seen[message.key] = i + 1
        if i == len(out):
            out.append([])
        out[i].append(message)
    return out


class Relay(PartitionHolder):
    """Publishes the committed rows of an outbox model, at least once, in order per key.

    Guarantees: every ``ready`` row is eventually published and marked ``done`` (or
    ``failed`` with the reason when the broker or its client can never accept it, or it
    failed on its own :data:`MESSAGE_ATTEMPTS` times in a row) as long as some relay
    runs and the broker comes back; one message's failure never holds back or
    re-publishes the others of its round; a key's messages are published in ``id``
    order and a later one is never sent before an earlier one was confirmed; a relay
    that lost its partition's lease (or whose claim was taken back) marks nothing
    published. A message may be published more than once (a relay that dies between the
    broker's confirm and its completion); every copy carries the same idempotency key.

    All relays of one model must use the same ``partitions``. ``max_partitions`` caps
    how many this relay holds (default all), so several relays share the partitions;
    the others stand by and take a partition over when its lease ends. ``lease`` is both
    the partition lease and the claimed rows' lease, in seconds.
    """

    def __init__(
        self,
        model: type[OutboxMessage],
        publisher: Publisher,
        *,
        partitions: int = 1,
        max_partitions: int | None = None,
        batch: int = 100,
        lease: float = 30.0,
        poll: float = 0.5,
        backoff: float = 0.5,
        backoff_max: float = 30.0,
        using: str | None = None,
        owner: str | None = None,
    ) -> None:
        model = outbox_model(model)
        values = validate(
            {
                "partitions": partitions,
                "max_partitions": partitions if max_partitions is None else max_partitions,
                "batch": batch,
                "lease": lease,
                "poll": poll,
                "backoff": backoff,
                "backoff_max": backoff_max,
            },
            error=ValueError,
        )
        super().__init__(
            model,
            partitions=values["partitions"],
            max_partitions=values["max_partitions"],
            lease=values["lease"],
            using=using or router.db_for_write(model),
            owner=owner or f"{default_worker_id()}:relay:{uuid.uuid4().hex[:8]}",
        )
        self.publisher = publisher
        self.batch: int = values["batch"]
        self.poll: float = values["poll"]
        self.backoff: float = values["backoff"]
        self.backoff_max: float = values["backoff_max"]
        #: Messages published and completed by this relay.
        self.published = 0

    def run(self, *, burst: bool = False, on_idle: Callable[[], None] | None = None) -> int:
        """Relay until :meth:`stop` (or, with ``burst``, until a pass over the partitions it
        could take found nothing to publish). Returns the number of messages published."""
        try:
            while not self.stopping:
                try:
                    self._hold_partitions()
                    moved = sum(self._drain(p) for p in sorted(self.locks))
                except DatabaseError as exc:
                    # A batch may be left half-done (claimed, maybe published, not
                    # completed). Give the partitions up: whoever takes one next (this
                    # relay too) first releases its processing rows, so the key's order
                    # restarts at its oldest unpublished row.
                    logger.warning("relay database error=%s; retrying", redact(str(exc)))
                    close_old_connections()
                    for partition in list(self.locks):
                        self._drop(partition, release=True)
                    self._next_acquire = 0.0
                    self._wait(self.poll)
                    continue
                if moved:
                    continue
                if burst:
                    break
                if on_idle is not None:
                    on_idle()
                self._wait(self.poll)
        finally:
            for partition in list(self.locks):
                self._drop(partition, release=True)
            self.publisher.close()
        return self.published

    # -- one batch ------------------------------------------------------------------
    def _drain(self, partition: int) -> int:
        """Claim, publish and complete one batch of ``partition``; the number published."""
        lock = self.locks.get(partition)
        if lock is None or not lock.held or self.stopping:
            return 0
        rows = self._scope(partition).claim(self.batch, lease=self.lease, worker=self.owner)
        if not rows:
            return 0
        rows.sort(key=lambda r: r.pk)
        rows, held_back = self._in_key_order(partition, rows)
        if held_back:
            self._give_back(held_back)
        if not rows:
            return len(held_back)
        confirmed: list[Any] = []
        unsent: list[Any] = []
        all_rounds = rounds(rows)
        live = list(rows)
        for i, batch in enumerate(all_rounds):
            if not self._publish_round(partition, batch, live, confirmed):
                # Give back what is neither confirmed nor dead-lettered (out of ``live``).
                keep = {id(m) for m in live} - {id(m) for m in confirmed}
                unsent = [m for r in all_rounds[i:] for m in r if id(m) in keep]
                break
        lost = complete_many(confirmed) if confirmed else []
        if unsent and lock.held:
            self._give_back(unsent)
        done = len(confirmed) - len(lost)
        self.published += done
        logger.debug(
            "relay batch model=%s partition=%s claimed=%s published=%s lost=%s",
            self.model._meta.label,
            partition,
            len(rows),
            done,
            len(lost),
        )
        return len(rows)

    def _in_key_order(self, partition: int, rows: list[Any]) -> tuple[list[Any], list[Any]]:
        """Split claimed rows into those that may go now and those to give back: a row
        waits while an earlier row of its key is still unpublished and not in this batch.

        One holder per partition claims in ``id`` order, but a claim may still pass over
        a row: ``SKIP LOCKED`` skips rows another transaction has locked (on InnoDB a
        locking read keeps locks on rows it only scanned, so another partition's claim
        can hide one of ours for a moment). This check makes the order not depend on it.
        """
        claimed = [r.pk for r in rows]
        earliest = dict(
            self._scope(partition)
            .filter(key__in={r.key for r in rows}, pk__lt=max(claimed))
            .exclude(pk__in=claimed)
            .in_state("ready", "processing")
            .order_by()
            .values("key")
            .annotate(first=Min("pk"))
            .values_list("key", "first")
        )
        if not earliest:
            return rows, []
        go = [r for r in rows if r.key not in earliest or r.pk < earliest[r.key]]
        wait = [r for r in rows if not (r.key not in earliest or r.pk < earliest[r.key])]
        logger.debug(
            "relay held back model=%s partition=%s rows=%s: earlier rows of their keys "
            "are not in the batch",
            self.model._meta.label,
            partition,
            len(wait),
        )
        return go, wait

    def _publish_round(
        self, partition: int, batch: list[Any], rows: list[Any], confirmed: list[Any]
    ) -> bool:
        """Publish one round until each of its messages is confirmed or dead-lettered,
        retrying only the unsettled ones, with backoff; ``False`` when the partition was
        lost or the relay is stopping (the unsettled ones are then given back)."""
        delay = self.backoff
        pending = list(batch)
        errors: dict[str, int] = {}
        while pending:
            lock = self.locks.get(partition)
            if lock is None or not lock.held:
                return False
            try:
                self.publisher.publish_batch(pending)
            except PublishError as exc:
                pending = self._settle(pending, exc, errors, rows, confirmed)
                if not pending:
                    break
                logger.warning(
                    "relay publish failed model=%s partition=%s messages=%s error=%s; "
                    "retrying in %.2fs",
                    self.model._meta.label,
                    partition,
                    len(pending),
                    redact(str(exc)),
                    delay,
                )
                if not self._wait(delay, partition, rows):
                    return False
                delay = min(self.backoff_max, delay * 2) * random.uniform(0.8, 1.0)
                continue
            confirmed.extend(pending)
            break
        return self._keep_alive(partition, rows)

    def _settle(
        self,
        pending: list[Any],
        exc: PublishError,
        errors: dict[str, int],
        rows: list[Any],
        confirmed: list[Any],
    ) -> list[Any]:
        """Sort a round's messages by what the publisher said of each; the ones to retry.

        Confirmed ones are never sent again; a rejected one is dead-lettered now; one
        that failed on its own (``exc.errors``) is dead-lettered at its
        :data:`MESSAGE_ATTEMPTS`-th failure in a row; the rest are retried, uncounted."""
        done = (
            {m.idempotency_key for m in pending} - set(exc.rejected)
            if isinstance(exc, MessagesRejected)
            else exc.confirmed
        )
        retry = []
        for message in pending:
            ident = message.idempotency_key
            if ident in exc.rejected:
                self._dead_letter(message, f"rejected: {exc.rejected[ident]}", rows)
            elif ident in done:
                confirmed.append(message)
            elif ident in exc.errors:
                errors[ident] = errors.get(ident, 0) + 1
                if errors[ident] >= MESSAGE_ATTEMPTS:
                    self._dead_letter(
                        message,
                        f"failed {errors[ident]} times in a row while the broker was "
                        f"reachable: {exc.errors[ident]}",
                        rows,
                    )
                else:
                    retry.append(message)
            else:
                retry.append(message)
        return retry

    def _dead_letter(self, message: Any, reason: str, rows: list[Any]) -> None:
        """Mark ``message`` ``failed`` with ``reason`` (fenced)."""
        logger.warning(
            "relay message failed model=%s pk=%s reason=%s",
            self.model._meta.label,
            message.pk,
            reason,
        )
        try:
            fail(message, reason)
        except ClaimLost:
            pass
        rows.remove(message)  # settled: no lease to keep alive

    def _give_back(self, rows: Sequence[Any]) -> None:
        """Release rows claimed but not published (fenced; the attempt is not counted)."""
        for row in rows:
            try:
                release(row)
            except ClaimLost:
                continue
            except DatabaseError as exc:
                logger.warning("relay release failed pk=%s error=%s", row.pk, exc)
                return
