"""Tenant fairness: a greedy tenant's jobs are rerouted to slower, weighted queues.

A feature folder, one module per layer: ``middleware`` (the client middleware, its
settings and Lua script), ``section`` (the ``fair_tenant:`` config section and its
variables), ``checks`` (every rule's queue is fetched somewhere), ``admin`` (the busiest
tenants, for operators), ``commands`` (``limitd tenants``) and ``plug`` (registers the
feature). See ``limitd.plugins``.
"""
