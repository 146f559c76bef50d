"""The middleware every client and every capsule starts with. Each is a no-op for jobs
that do not use its feature, so the chains are the same for everyone."""

from __future__ import annotations

from typing import Any

from limitd.middleware.batch import BatchMembership, BatchProgress
from limitd.middleware.chain import ClientChain, ServerChain
from limitd.middleware.fair_tenant import FairTenant, FairTenantSettings
from limitd.middleware.unique import UniqueJobs, UniqueRelease


def default_client_chain(fair_tenant: FairTenantSettings | None = None) -> ClientChain:
    """Batch membership first (it must see a later middleware halt the push, to take the
    job back out of the batch), then uniqueness (keyed on the queue asked for, before
    fairness may reroute it), then tenant fairness (a skipped duplicate is not counted
    against its tenant). ``fair_tenant``: a config's settings, else the
    ``LIMITD_FAIR_TENANT_*`` variables over the defaults."""
    return ClientChain([BatchMembership(), UniqueJobs(), FairTenant(fair_tenant)])


def default_server_chain(redis: Any) -> ServerChain:
    """Batch progress, then unique-lock release, both reporting on the capsule's Redis."""
    return ServerChain([BatchProgress(), UniqueRelease(redis)])
