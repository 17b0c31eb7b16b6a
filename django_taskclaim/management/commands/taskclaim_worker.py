"""``manage.py taskclaim_worker``: the ``worker`` command under a prefixed name.

If another installed app also ships a ``worker`` command, Django runs the one of the app
listed first in ``INSTALLED_APPS``; ``taskclaim_worker`` always reaches this one.
"""

from django_taskclaim.management.commands.worker import Command as WorkerCommand


class Command(WorkerCommand):
    help = "Alias of worker. " + WorkerCommand.help
