"""The race lab: every claim technique raced by concurrent processes, double claims counted.

Add ``"django_taskclaim.contrib.racelab"`` to ``INSTALLED_APPS`` and run ``migrate`` to
get ``manage.py taskclaim_racelab`` (see ``docs/racelab.md``). Its claimable model is
left out of the project's queues by ``RaceLabConfig.taskclaim_discover = False``.
Nothing in ``django_taskclaim`` imports this package; the library works the same with
or without it.

Modules: :mod:`.models` (the lab's tables), :mod:`.techniques` (the claim techniques
raced), :mod:`.lab` (:class:`~.lab.RaceLab`, the claimer processes), :mod:`.report`
(results and their table), :mod:`.cli` (what the management command runs).
"""
