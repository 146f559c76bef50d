"""limitd: Redis-backed background jobs in Sidekiq's format.

The public API::

    import limitd

    @limitd.job(queue="default")
    def hello(name): print("hello", name)

    hello.perform_async("world")
"""

__version__ = "0.1.0"

from limitd import retry as _retry  # noqa: F401  (declares the retry job options)
from limitd.batch import Batch, BatchNotOpen, BatchStatus
from limitd.client import Client, default_client, set_default_client
from limitd.configure import configure as _load_and_connect
from limitd.fetch.recoveries import RecoveredTooOften
from limitd.job import Enqueuer, Job, JobSpec, current_payload, job
from limitd.options import InvalidJobOption
from limitd.payload import MalformedPayload, UnsafeArgument
from limitd.registry import registry


# Defined after the submodule limitd.configure is imported above: importing a submodule
# sets the package attribute of its name, which would otherwise replace this function
# with the module the first time anything imports limitd.configure.
def configure(*paths: str, url: str | None = None) -> Client:
    """Use the Redis that these config files name (see :mod:`limitd.configure`)."""
    return _load_and_connect(*paths, url=url)


__all__ = [
    "Batch",
    "BatchNotOpen",
    "BatchStatus",
    "Client",
    "Enqueuer",
    "InvalidJobOption",
    "Job",
    "JobSpec",
    "MalformedPayload",
    "RecoveredTooOften",
    "UnsafeArgument",
    "__version__",
    "configure",
    "current_payload",
    "default_client",
    "job",
    "registry",
    "set_default_client",
]
