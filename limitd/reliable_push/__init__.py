"""Reliable push: while Redis does not answer, pushes wait in a bounded in-memory buffer
instead of failing the caller, and a background thread writes them, in order, once Redis
is back (Sidekiq Pro's reliable client).

Opt-in, for the processes that enqueue (a web app): ``limitd.reliable_push.app.enable()``.
``hold`` is the buffer (a push gate, see ``limitd.plugins.add_push_gate``), ``app`` turns
it on and off. The buffer is memory: what it holds is lost if the process dies, and the
transactional outbox (``limitd.outbox``) is the durable answer.
"""
