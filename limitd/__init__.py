"""limitd: Redis-backed background jobs in Sidekiq's format.

The public API::

    import limitd

    @limitd.job(queue="default")
    def hello(name): print("hello", name)

    hello.perform_async("world")
"""

# Last: the shipped features register themselves (see limitd.features).
from limitd import features as _features  # noqa: F401
from limitd import retry as _retry  # noqa: F401  (declares the retry job options)
from limitd.app_hooks import ClientConfig, ServerConfig, configure_client, configure_server
from limitd.batch.app import Batch, BatchNotOpen, BatchStatus
from limitd.capacity.job import LimitedCapacityJob
from limitd.client import Client, configure, default_client, redis_client, set_default_client
from limitd.connection.replication import NotReplicated
from limitd.fetch.recoveries import RecoveredTooOften
from limitd.iteration.app import acancelled, cancelled
from limitd.iteration.job import IterableJob
from limitd.job import Enqueuer, Job, job
from limitd.limiters.limiter import Limiter, OverLimit
from limitd.options import InvalidJobOption
from limitd.payload import MalformedPayload, UnsafeArgument
from limitd.registry import registry
from limitd.spec import JobSpec, current_payload
from limitd.time_limits import TimeLimitExceeded
from limitd.transactions.app import transaction_aware
from limitd.version import __version__

__all__ = [
    "Batch",
    "BatchNotOpen",
    "BatchStatus",
    "Client",
    "ClientConfig",
    "Enqueuer",
    "InvalidJobOption",
    "IterableJob",
    "Job",
    "JobSpec",
    "LimitedCapacityJob",
    "Limiter",
    "MalformedPayload",
    "NotReplicated",
    "OverLimit",
    "RecoveredTooOften",
    "ServerConfig",
    "TimeLimitExceeded",
    "UnsafeArgument",
    "__version__",
    "acancelled",
    "cancelled",
    "configure",
    "configure_client",
    "configure_server",
    "current_payload",
    "default_client",
    "job",
    "redis_client",
    "registry",
    "set_default_client",
    "transaction_aware",
]
