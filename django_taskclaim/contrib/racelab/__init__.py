"""The race lab: every claim technique raced by concurrent processes, double claims counted.

Add ``"django_taskclaim.contrib.racelab"`` to ``INSTALLED_APPS`` to get
``manage.py taskclaim_racelab`` (see ``docs/racelab.md``). The app needs no migration:
its scratch tables exist only while the lab runs. Nothing in ``django_taskclaim``
imports this package; the library works the same with or without it.

Modules: :mod:`.models` (the scratch tables), :mod:`.techniques` (the claim techniques
raced), :mod:`.lab` (:class:`~.lab.RaceLab`, the claimer processes), :mod:`.report`
(results and their table), :mod:`.cli` (what the management command runs).
"""
