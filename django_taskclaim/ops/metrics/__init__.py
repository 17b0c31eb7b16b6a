"""What an operator's monitoring reads from the database: the queue gauges
(:mod:`.gauges`), their Prometheus text (:mod:`.exposition`) and the protected view that
serves it (:mod:`.views`). The worker's own counters are OpenTelemetry instruments,
:mod:`django_taskclaim.telemetry`. See docs/observability.md."""
