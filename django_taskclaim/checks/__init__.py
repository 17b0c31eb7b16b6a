"""Every system check of the app (ids ``taskclaim.E…`` / ``taskclaim.W…``, tagged
``taskclaim``): importing this package registers them; ``apps.TaskClaimConfig.ready`` does.

``core`` (settings, ``ClaimMeta``, strategies, archives), ``locks`` (lock settings and
poolers), ``concurrency_keys`` (the constraint behind ``ClaimMeta.concurrency_key``),
``unique`` (unique-enqueue keys); ``schema`` (tables and columns) is tagged ``database``
only, for ``--database`` and ``migrate``.
"""

from django_taskclaim.checks import concurrency_keys, core, locks, schema, unique

__all__ = ["concurrency_keys", "core", "locks", "schema", "unique"]
