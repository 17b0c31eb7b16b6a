"""Signals for metrics and hooks. Sending costs nothing when nobody listens.

- ``task_claimed(sender=Model, tasks=[...], worker=str, using=str)``
- ``task_completed(sender=Model, task=row)``
- ``task_failed(sender=Model, task=row, error=exc|str, final=bool)`` — ``final`` is
  False when the task was scheduled for a retry.
- ``task_reaped(sender=Model, requeued=int, failed=int, using=str)``
"""

from django.dispatch import Signal

task_claimed = Signal()
task_completed = Signal()
task_failed = Signal()
task_reaped = Signal()
