"""The one way a command option is declared: :class:`Option`.

Each command's options are a table of :class:`Option` beside what they configure: the
worker's in :data:`django_taskclaim.worker.options.OPTIONS`, the relay's in
:data:`django_taskclaim.outbox.options.RELAY_OPTIONS` (and the command's own), the
reaper's in :data:`django_taskclaim.management.commands.reaper.OPTIONS`. One option
carries its keyword, command-line spellings, type, default (or the ``TASKCLAIM_*``
setting read live), bound and help; :func:`add_arguments` puts a table on a parser and
:meth:`Option.resolve` turns what was given into the value, checked with
:func:`django_taskclaim.config.bounds.number`, so a mistake is one line naming the flag.
Imports only :mod:`.bounds` and :mod:`.settings`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.management.base import CommandParser

from django_taskclaim.config import bounds
from django_taskclaim.config.bounds import Bound
from django_taskclaim.config.settings import taskclaim_settings
from django_taskclaim.exceptions import ConfigurationError


@dataclass(frozen=True)
class Option:
    """One command option.

    ``name`` is the keyword the option's value is given as (a config field, a class's
    argument); ``flags`` its command-line spellings, the long one first (none: not on the
    command line). A value not given (``None``) is the ``TASKCLAIM_<setting>`` read live
    if ``setting`` is set, else ``default`` (``None``: none). A ``bool`` option is a
    switch that turns its default over (``--burst``: on; ``--no-reap``: off); a
    ``repeat`` one is given once per value. ``bound`` is a :class:`Bound` or a function
    of the values resolved before this option that returns one (``max_partitions`` ≤
    ``partitions``).
    """

    name: str
    flags: tuple[str, ...]
    kind: type
    default: Any
    help: str
    bound: Bound | Callable[[Mapping[str, Any]], Bound] | None = None
    setting: str | None = None
    repeat: bool = False
    metavar: str | None = None
    required: bool = False

    @property
    def flag(self) -> str:
        """The long command-line spelling (``--max-partitions``); the name if none."""
        return self.flags[0] if self.flags else self.name

    @property
    def dest(self) -> str:
        """The key of this option in the command's parsed options."""
        return self.flag.lstrip("-").replace("-", "_")

    def bound_for(self, earlier: Mapping[str, Any]) -> Bound | None:
        """The bound given the values resolved before this option."""
        if self.bound is None or isinstance(self.bound, Bound):
            return self.bound
        return self.bound(earlier)

    def default_value(self) -> Any:
        """The value when none is given: its setting (read live) or its default."""
        return getattr(taskclaim_settings, self.setting) if self.setting else self.default

    def add_to(self, parser: CommandParser) -> None:
        """This option on ``parser``. A value stays text (``None`` when not given) until
        :meth:`resolve` checks it, so that every mistake gives one line naming the fix."""
        extra: dict[str, Any] = {"help": self.help}
        if self.metavar is not None:
            extra["metavar"] = self.metavar
        if self.required:
            extra["required"] = True
        if self.kind is bool:
            parser.add_argument(*self.flags, action="store_true", **extra)
        elif self.repeat:
            parser.add_argument(*self.flags, action="append", default=None, **extra)
        else:
            parser.add_argument(*self.flags, default=None, **extra)

    def check(
        self,
        value: Any,
        *,
        earlier: Mapping[str, Any] | None = None,
        label: str | None = None,
        parse: bool = True,
        error: type[Exception] = ConfigurationError,
    ) -> Any:
        """``value`` (given) as the option's value: a switch's ``bool``, a bounded number
        within :meth:`bound_for` ``earlier`` (``parse``: text too), anything else as it
        is; ``error`` naming ``label`` (default: the flag) otherwise."""
        if self.kind is bool:
            return bool(value)
        bound = self.bound_for(earlier or {})
        if bound is None:
            return value
        return bounds.number(value, label or self.flag, bound, parse=parse, error=error)

    def resolve(
        self,
        value: Any,
        *,
        earlier: Mapping[str, Any] | None = None,
        label: str | None = None,
        parse: bool = True,
        error: type[Exception] = ConfigurationError,
    ) -> Any:
        """``value`` checked (:meth:`check`), or, when it is ``None`` (not given),
        :meth:`default_value`; ``None`` when that is ``None`` too."""
        if value is None:
            value = self.default_value()
        if value is None:
            return None
        return self.check(value, earlier=earlier, label=label, parse=parse, error=error)


def add_arguments(parser: CommandParser, options: Iterable[Option]) -> None:
    """Every option of ``options`` that has a command-line spelling on ``parser``."""
    for option in options:
        if option.flags:
            option.add_to(parser)


def parsed_values(parsed: Mapping[str, Any], options: Iterable[Option]) -> dict[str, Any]:
    """name -> the value of each option with a command-line spelling in the command's
    ``parsed`` options, unchecked (text): a switch given turns its default over, an
    option not given is its :meth:`~Option.default_value`."""
    values: dict[str, Any] = {}
    for option in options:
        if not option.flags:
            continue
        value = parsed[option.dest]
        if option.kind is bool:
            value = (not option.default) if value else option.default
        values[option.name] = option.default_value() if value is None else value
    return values
