"""The admin API: what operators (and the CLI) read and steer at run time.

Queues (their jobs, limits, pause flag and busy slots), the ``schedule`` / ``retry`` /
``dead`` sorted sets, the limit-fetch capsules, the global counters, the tenants that
tenant fairness tracks and the batches, read straight
from Sidekiq's data model and limitd's ``limitd:`` keys, so the same calls work on jobs
a Ruby client pushed. The server never imports this package: nothing here is on a
running job's path::

    from limitd.api import Queue, RetrySet, Stats

    for entry in RetrySet():
        if entry.error_class == "TimeoutError":
            entry.retry()
    Queue("webhooks").limit = 5
    print(Queue("default").latency(), Stats().enqueued)

One module per part: ``records`` (the job record shared by all), ``queues``,
``sorted_sets``, ``capsules``, ``stats``, ``tenants`` and ``batches``; limiters are
listed by ``limiters()`` and how full they are now by ``limiter_usage()`` (from
``limitd.limiters.admin``), limited-capacity jobs by
``capacity()`` (from ``limitd.capacity.admin``), periodic entries by
``periodic_status()`` (from ``limitd.periodic.admin``), the per-class job history
by ``job_history()`` (from ``limitd.job_history.admin``), an iterable job's progress by
``iteration_progress()`` (from ``limitd.iteration.admin``); ``cancel(jid)`` cancels a
job (``cancel``).
"""

from limitd.api.cancel import Cancellation, cancel
from limitd.api.capsules import Capsule, Capsules
from limitd.api.processes import Processes, ProcessStatus
from limitd.api.queues import Queue, QueueEntry
from limitd.api.records import PAGE_SIZE, JobRecord
from limitd.api.sorted_sets import (
    DeadSet,
    EntryFilter,
    FilteredPage,
    PendingEntry,
    PendingSet,
    RetrySet,
    ScheduledSet,
    SortedEntry,
    SortedSet,
)
from limitd.api.stats import (
    QueueStatus,
    RedisInfo,
    Stats,
    daily_history,
    minute_history,
    queue_overview,
    redis_info,
)
from limitd.api.work import RunningJob, running_jobs
from limitd.batch.admin import (
    BatchCallback,
    BatchDetail,
    BatchStatus,
    batch_detail,
    batch_status,
    list_batches,
)
from limitd.capacity.admin import CapacityStatus, capacity
from limitd.fair_queues.admin import (
    FairQueueStatus,
    FairSetting,
    fair_queue_status,
    make_fair,
    make_plain,
    reset_fairness,
    set_tenant_weight,
)
from limitd.fair_tenant.admin import RuleWindow, TenantStatus, reroutes, top_tenants
from limitd.iteration.admin import IterationProgress, iteration_progress, iteration_progress_of
from limitd.job_history.admin import ClassHistory, MinuteFigures, job_history
from limitd.limiters.admin import LimiterStatus, limiter_usage, limiters
from limitd.periodic.admin import PeriodicStatus, periodic_status

__all__ = [
    "PAGE_SIZE",
    "BatchCallback",
    "BatchDetail",
    "BatchStatus",
    "Cancellation",
    "CapacityStatus",
    "Capsule",
    "Capsules",
    "ClassHistory",
    "DeadSet",
    "EntryFilter",
    "FairQueueStatus",
    "FairSetting",
    "FilteredPage",
    "IterationProgress",
    "JobRecord",
    "LimiterStatus",
    "MinuteFigures",
    "PendingEntry",
    "PendingSet",
    "PeriodicStatus",
    "ProcessStatus",
    "Processes",
    "Queue",
    "QueueEntry",
    "QueueStatus",
    "RedisInfo",
    "RetrySet",
    "RuleWindow",
    "RunningJob",
    "ScheduledSet",
    "SortedEntry",
    "SortedSet",
    "Stats",
    "TenantStatus",
    "batch_detail",
    "batch_status",
    "cancel",
    "capacity",
    "daily_history",
    "fair_queue_status",
    "iteration_progress",
    "iteration_progress_of",
    "job_history",
    "limiter_usage",
    "limiters",
    "list_batches",
    "make_fair",
    "make_plain",
    "minute_history",
    "periodic_status",
    "queue_overview",
    "redis_info",
    "reroutes",
    "reset_fairness",
    "running_jobs",
    "set_tenant_weight",
    "top_tenants",
]
