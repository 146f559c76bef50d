"""The client half of fair queues: every job that names a tenant carries it as the
``fair_tenant`` field, checked, so that a fair queue's fetch can put it in its
tenant's line.

The tenant is the one the tenant-fairness middleware already resolves: set with
``.set(fair_tenant=...)`` or in the payload, else returned by the job's ``fair_tenant``
method. A client does not know which queues are fair (that can change at run time), so
every job with a tenant is stamped; the field costs nothing to a plain queue.

A tenant that is not a string, is empty, or is longer than 1 KB is refused at enqueue
(``InvalidJobOption``): nothing is written, and the error names the job.
"""

from __future__ import annotations

from limitd import options
from limitd.fair_queues.store import check_tenant
from limitd.middleware.base import ClientMiddleware
from limitd.payload import Payload
from limitd.spec import JobSpec

FIELD = "fair_tenant"


class FairTenantField(ClientMiddleware):
    """Client middleware: resolve, check and stamp ``fair_tenant`` (see the module)."""

    def concerns(self, spec: JobSpec | None, payload: Payload) -> bool:
        """Jobs that name a tenant, or whose class resolves one from its args."""
        return FIELD in payload or (spec is not None and spec.hooks.get("tenant") is not None)

    def push_work(self, spec: JobSpec | None, payload: Payload) -> None:
        tenant = payload.get(FIELD)
        if tenant is None:
            hook = None if spec is None else spec.hooks.get("tenant")
            if hook is None:
                return None  # most jobs: no tenant at all
            tenant = hook(*payload.get("args", ()))
            if tenant is None:
                return None
        where = f"{payload.get('class')} (jid {payload.get('jid')})"
        try:
            tenant = check_tenant(tenant, where)
        except ValueError as exc:
            raise options.InvalidJobOption(str(exc)) from None
        first_key(payload, FIELD, tenant)
        return None


def first_key(payload: Payload, key: str, value: str) -> None:
    """Set ``key`` as the payload's first key: a fair queue's fetch reads the tenant
    from the start of the job's JSON without decoding it (limitd/fetch/fair_lib.lua)."""
    if next(iter(payload), None) == key:
        payload[key] = value
        return
    rest = [(name, item) for name, item in payload.items() if name != key]
    payload.clear()
    payload[key] = value
    payload.update(rest)
