"""The features limitd ships, registered in the order their middleware run.

Order matters for the client chain: batch membership first (it must see a later
middleware halt the push, to take the job back out of the batch), then uniqueness
(keyed on the queue asked for, before fairness may reroute it), then tenant fairness
(a skipped duplicate is not counted against its tenant), just after the fair queues'
tenant stamp (which resolves the tenant once, for both). On the server side, expiry
comes after uniqueness (an expired job's ``executing`` lock goes as it would have
started) and before the limiters (an expired job takes no rate-limit token). Limiters
have only a server middleware, innermost, so it sees ``OverLimit`` straight from the
job. Limited-capacity jobs, periodic jobs, metrics, the outbox and the web dashboard
have no default middleware (the job metrics middleware is added by its per-process
service), so their place is free. Tracing has none either: its service, when the config
turns it on, puts its middleware first in each chain, so its spans cover the others.

Iteration only binds an iterable job's run to its capsule (no Redis work, no effect on
the others), so its place is free; it sits before encryption, which stays last.

Encryption comes last: its client middleware seals the arguments after every other has
seen them in clear, and its server middleware puts the sealed ones back before any
outer one records the job (a limiter's reschedule, the retry decision).

Adding a feature: a folder with its modules and a ``plug`` module describing it as one
``limitd.plugins.Feature``, then one line here. ``import limitd`` runs this module, so a
plug imports at its top only what enqueueing needs; its commands, metrics and services
import their modules when called (see ``limitd.plugins``).
"""

from limitd import plugins
from limitd.batch.plug import BATCH
from limitd.capacity.plug import CAPACITY
from limitd.encryption.plug import ENCRYPTION
from limitd.expiry.plug import EXPIRY
from limitd.fair_queues.plug import FAIR_QUEUES
from limitd.fair_tenant.plug import FAIR_TENANT
from limitd.iteration.plug import ITERATION
from limitd.job_history.plug import JOB_HISTORY
from limitd.limiters.plug import LIMITERS
from limitd.metrics.plug import METRICS
from limitd.outbox.plug import OUTBOX
from limitd.periodic.plug import PERIODIC
from limitd.time_limits.plug import TIME_LIMITS
from limitd.tracing.plug import TRACING
from limitd.unique.plug import UNIQUE
from limitd.web.plug import WEB

SHIPPED = (BATCH, UNIQUE, EXPIRY, FAIR_QUEUES, FAIR_TENANT, LIMITERS, CAPACITY, PERIODIC, METRICS,
           OUTBOX, WEB, TRACING, TIME_LIMITS, JOB_HISTORY, ITERATION, ENCRYPTION)

for _feature in SHIPPED:
    plugins.register(_feature)
