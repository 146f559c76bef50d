"""Fair queues: a queue whose tenants are served in turn, with weights and an optional
per-tenant concurrency limit (docs/features/fair-queues.md).

The fetch does the work, in its own script (``limitd/fetch/limit_fetch.lua`` with
``fair_lib.lua``): it sorts a fair queue's arrivals into one line per tenant and takes
jobs by turns. This folder holds the rest: the settings in Redis and the admin scripts
(``store``), the client middleware that stamps each job's tenant, the ``fair_queues:``
config section and its check, the process service and housekeeping that write the
configured settings, the ``limitd fair`` command, metrics and the admin API.
"""
