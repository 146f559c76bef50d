"""Time limits: how long a job may run before it fails with ``TimeLimitExceeded``.

``plug`` (loaded by ``import limitd``) declares the ``time_limit`` job option, the error
and the ``time_limits:`` config section; the watchdog and the middleware that enforce
the limits load in ``limitd start``'s capsule processes only (``process``).

The error and the section's keys live here, the folder's bottom, for the middleware,
the section reader and the plug alike."""

TIME_LIMITS_KEYS = frozenset({"default", "grace", "capsules"})


class TimeLimitExceeded(Exception):
    """A job ran past its ``time_limit``. An ``Exception``, so the job's retry policy
    applies as to any failure (``retry``, ``retry_in``, the retry and dead sets)."""

    wire_name = "limitd.TimeLimitExceeded"  # the error_class in retry and dead entries
