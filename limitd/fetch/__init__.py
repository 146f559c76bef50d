"""Taking jobs out of Redis: queue ordering and fetch strategies."""

from limitd.fetch.basic import BasicFetch, UnitOfWork
from limitd.fetch.order import QueueOrder

__all__ = ["BasicFetch", "QueueOrder", "UnitOfWork"]
