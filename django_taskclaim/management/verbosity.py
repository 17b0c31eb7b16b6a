"""``-v`` of the library's management commands, mapped to its loggers."""

from __future__ import annotations

import logging


def configure_logging(verbosity: int) -> None:
    """Map ``-v`` to the ``django_taskclaim`` logger level; add a stderr handler if none."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    root = logging.getLogger("django_taskclaim")
    root.setLevel(level)
    if not root.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        root.addHandler(handler)
