"""Partition takeover: which key-hash partitions a relay holds, by lease.

Ordering keys are hashed into ``partitions`` ranges; each partition is held by one
relay at a time through a :class:`~django_taskclaim.locks.LeaseLock`
(``taskclaim.outbox:<model>:<partitions>:<p>``), renewed every ``lease / 3``. A relay
that takes a partition over first releases the rows its previous holder left
``processing`` (bumping their claim tokens): that holder's completions then match
nothing (FENCED), and the new holder re-publishes them in order (at least once).

:class:`PartitionHolder` is the base of :class:`~django_taskclaim.outbox.relay.Relay`
(:mod:`.relay`: the rounds it publishes in the partitions it holds); the key-hash ranges
are :func:`~django_taskclaim.outbox.models.partition_range`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from django_taskclaim.locks import LeaseLock
from django_taskclaim.outbox.models import OutboxMessage, partition_range

logger = logging.getLogger("django_taskclaim.outbox")


class PartitionHolder:
    """Takes, renews and gives back the partitions of one outbox model (validated
    arguments: see :class:`~django_taskclaim.outbox.relay.Relay`), and waits while
    keeping the held ones alive."""

    def __init__(
        self,
        model: type[OutboxMessage],
        *,
        partitions: int,
        max_partitions: int,
        lease: float,
        using: str,
        owner: str,
    ) -> None:
        self.model = model
        self.partitions = partitions
        self.max_partitions = max_partitions
        self.lease = lease
        self.using = using
        self.owner = owner
        self.locks: dict[int, LeaseLock] = {}
        self._stop = threading.Event()
        self._renewed: dict[int, float] = {}
        self._next_acquire = 0.0

    # -- control -----------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the relay to stop: it ends the batch in hand (a batch waiting for the
        broker gives its unconfirmed rows back), releases its partitions and returns."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set()

    def lock_key(self, partition: int) -> str:
        """The lease-lock key of ``partition``."""
        return f"taskclaim.outbox:{self.model._meta.label_lower}:{self.partitions}:{partition}"

    # -- partitions -----------------------------------------------------------------
    def _hold_partitions(self) -> None:
        """Renew the held partitions that are due, drop the lost ones, and try to take
        free ones up to ``max_partitions``."""
        now = time.monotonic()
        for partition, lock in list(self.locks.items()):
            if not lock.held:
                self._drop(partition, release=False)
            elif now - self._renewed.get(partition, 0.0) >= self.lease / 3:
                if lock.renew():
                    self._renewed[partition] = now
                else:
                    self._drop(partition, release=False)
        if len(self.locks) >= self.max_partitions or now < self._next_acquire:
            return
        # Free partitions are tried every lease / 3 (a dead holder's lease ends after
        # ``lease``), not on every pass: that would be one statement per partition per poll.
        self._next_acquire = now + self.lease / 3
        free = [p for p in range(self.partitions) if p not in self.locks]
        random.shuffle(free)
        for partition in free:
            if len(self.locks) >= self.max_partitions:
                break
            lock = LeaseLock(
                self.lock_key(partition), self.lease, owner=self.owner, using=self.using
            )
            if lock.acquire():
                self.locks[partition] = lock
                self._renewed[partition] = time.monotonic()
                taken = self._scope(partition).processing().release()
                logger.info(
                    "relay partition acquired model=%s partition=%s/%s token=%s released=%s",
                    self.model._meta.label,
                    partition,
                    self.partitions,
                    lock.token,
                    taken,
                )

    def _drop(self, partition: int, *, release: bool) -> None:
        lock = self.locks.pop(partition)
        self._renewed.pop(partition, None)
        if release:
            lock.release()
        else:
            logger.warning(
                "relay partition lost model=%s partition=%s/%s",
                self.model._meta.label,
                partition,
                self.partitions,
            )

    def _scope(self, partition: int) -> Any:
        low, high = partition_range(partition, self.partitions)
        return self.model._default_manager.using(self.using).filter(
            key_hash__gte=low, key_hash__lt=high
        )

    def _keep_alive(self, partition: int, rows: Sequence[Any]) -> bool:
        """Renew the partition's lease and the rows' leases if due; ``False`` when lost."""
        lock = self.locks.get(partition)
        if lock is None or not lock.held:
            return False
        now = time.monotonic()
        if now - self._renewed.get(partition, 0.0) < self.lease / 3:
            return True
        if not lock.renew():
            return False
        self._renewed[partition] = now
        lost = self.model._default_manager.using(self.using).extend_leases(list(rows), self.lease)
        return not lost

    def _wait(self, seconds: float, partition: int | None = None, rows: Sequence[Any] = ()) -> bool:
        """Wait ``seconds`` (or until stopped), keeping the partition alive; ``False`` if
        it was lost or the relay is stopping."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._stop.wait(min(left, max(0.05, self.lease / 6))):
                return False
            if partition is not None and not self._keep_alive(partition, rows):
                return False
        return not self.stopping
