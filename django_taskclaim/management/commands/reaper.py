"""``manage.py reaper``: the same command as ``taskclaim_reap``."""

from django_taskclaim.management.commands.taskclaim_reap import Command as ReapCommand


class Command(ReapCommand):
    help = "Alias of taskclaim_reap. " + ReapCommand.help
