"""Flow control an operator can steer: pausing and resuming a model's queues
(:mod:`.pause`). Each name is imported from the module that defines it (or flat from
``django_taskclaim``)."""
