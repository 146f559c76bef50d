"""What becomes of a job that did not complete: the retry set with backoff, the dead set,
and the atomic moves out of the sorted sets (``schedule``, ``retry``, ``dead``) that the
scheduled poller and the admin API share.

- ``handler``: the retry decision (Sidekiq's rules), the dead set's trimming, and the
  error and death handlers told of failures and deaths;
- ``moves``: one Lua call per job moved out of a sorted set, so a job is pushed once.
"""

from limitd.retry.handler import (
    DeadSetPolicy,
    DeathHandler,
    ErrorHandler,
    Failure,
    Fate,
    RetryHandler,
    Unretriable,
    backoff_seconds,
    error_class_name,
    max_retries,
    record_error,
    trim_dead,
)

__all__ = [
    "DeadSetPolicy",
    "DeathHandler",
    "ErrorHandler",
    "Failure",
    "Fate",
    "RetryHandler",
    "Unretriable",
    "backoff_seconds",
    "error_class_name",
    "max_retries",
    "record_error",
    "trim_dead",
]
