"""``manage.py taskclaim_reap``: the ``reaper`` command under a prefixed name, for projects
where another app already owns ``reaper`` (docs/worker.md, "If your project already has a
``worker`` command")."""

from django_taskclaim.management.commands.reaper import Command as ReaperCommand


class Command(ReaperCommand):
    help = "Alias of reaper. " + ReaperCommand.help
