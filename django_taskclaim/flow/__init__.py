"""Flow control an operator can steer: pausing and resuming a model's queues
(:mod:`.pause`), and what the rate limits look like now (:mod:`.rate_view`). Each name
is imported from the module that defines it (or flat from ``django_taskclaim``)."""
