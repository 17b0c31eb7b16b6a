"""``manage.py worker``: the same command as ``taskclaim_worker``.

If another installed app also ships a ``worker`` command, Django runs the one of the app
listed first in ``INSTALLED_APPS``; ``taskclaim_worker`` always reaches this one.
"""

from django_taskclaim.management.commands.taskclaim_worker import Command as WorkerCommand


class Command(WorkerCommand):
    help = "Alias of taskclaim_worker. " + WorkerCommand.help
