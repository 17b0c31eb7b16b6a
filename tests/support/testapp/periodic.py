"""Found by the scheduler's discovery (``<app>.periodic``) in every worker process the
tests start; it declares the test schedules only where ``TASKCLAIM_T_PERIODIC`` is set
(the processes of ``tests/periodic/test_periodic.py``)."""

from __future__ import annotations

import os

if os.environ.get("TASKCLAIM_T_PERIODIC"):
    from tests.support.periodic_jobs import declare

    declare()
