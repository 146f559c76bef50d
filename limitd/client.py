"""Pushing jobs into Redis: normalise the payload, run the client middleware chain,
check the arguments, then write.

An immediate job is ``SADD queues <q>`` + ``LPUSH queue:<q> <json>`` + ``PUBLISH
limitd:wake <q>`` (which wakes idle capsules) in one round trip; a scheduled job is
``ZADD schedule <at> <json>`` + ``PUBLISH limitd:wake:due <at>`` (sleeping pollers then
wake at ``<at>`` if that is sooner than they planned). A bulk push writes one LPUSH per
queue per chunk, and one ZADD and one PUBLISH (of the earliest time) for its scheduled
jobs. After a Redis failover (READONLY, NOREPLICAS, UNBLOCKED) the push reconnects and
is tried once more, as Sidekiq does.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis as redis_py

from limitd import clock, keys, plugins
from limitd.connection import pipeline, replication, retry_on_failover
from limitd.connection.cluster import is_cluster
from limitd.connection.pinned import pinned
from limitd.connection.wire import pack_command, send_packed_all
from limitd.locate import Location, app_location, connect_to
from limitd.middleware.client_chain import ClientChain, was_written
from limitd.middleware.defaults import default_client_chain
from limitd.payload import (
    DEFAULT_QUEUE,
    STRICT_ARGS_MODES,
    Payload,
    check_args,
    dumps,
    new_jid,
)
from limitd.plugins import Push
from limitd.registry import registry
from limitd.spec import JobSpec


class Client:
    """Enqueues jobs. Thread-safe: share one per process."""

    def __init__(
        self,
        redis: redis_py.Redis | None = None,
        *,
        middleware: ClientChain | None = None,
        strict_args: str = "raise",
    ) -> None:
        if strict_args not in STRICT_ARGS_MODES:
            raise ValueError(f"strict_args must be one of {STRICT_ARGS_MODES}, not {strict_args!r}")
        self.redis = redis if redis is not None else connect_to(app_location())
        self.middleware = middleware if middleware is not None else default_client_chain()
        self.strict_args = strict_args

    @functools.cached_property
    def job_redis(self) -> redis_py.Redis:
        """``redis`` for jobs' own commands: one connection per thread, without the
        pool's per-command costs (see :mod:`limitd.pinned`)."""
        return pinned(self.redis)

    def push(self, item: Payload, spec: JobSpec | None = None) -> str | None:
        """Enqueue one job described by ``item`` (``class``, ``args``, options, and ``at``
        for a scheduled job). Returns the jid, or None when a middleware halted it.

        The push is offered to the features' push gates first (see
        :func:`limitd.plugins.gate_push`): inside a database transaction, the
        transactions feature validates it, returns its jid now and holds the whole push,
        middleware included, until the commit."""
        spec = spec or registry.resolve(str(item.get("class")))
        payload = normalize(item, spec)
        if plugins.has_push_gates():
            run = functools.partial(self.push_now, spec, payload)
            push = Push([payload], run, self.strict_args)
            if plugins.gate_push(push):
                return push.ran[0] if push.ran else str(payload["jid"])
        return self.push_now(spec, payload)

    def push_now(self, spec: JobSpec | None, payload: Payload) -> str | None:
        """Push a normalized payload through the middleware chain and write it, now,
        asking no gate: what a gate runs when it lets a held push go."""
        pushed = self.middleware.invoke(spec, payload, self.redis, self._push_one)
        return pushed["jid"] if pushed else None

    def push_bulk(
        self,
        item: Payload,
        args_list: Sequence[list[Any]],
        *,
        batch_size: int = 1000,
        spec: JobSpec | None = None,
    ) -> list[str | None]:
        """Enqueue one job per entry of ``args_list``, each through the middleware chain
        on its own, written in chunks of ``batch_size``. Returns jids in input order.
        Each chunk is offered to the push gates as one push, as :meth:`push` does."""
        spec = spec or registry.resolve(str(item.get("class")))
        jids: list[str | None] = []
        for chunk in bulk_chunks(item, args_list, batch_size, spec):
            push = None
            if plugins.has_push_gates():
                run = functools.partial(self.push_chunk_now, spec, chunk)
                push = Push(chunk, run, self.strict_args)
            if push is not None and plugins.gate_push(push):
                jids += push.ran[0] if push.ran else [payload["jid"] for payload in chunk]
            else:
                jids += self.push_chunk_now(spec, chunk)
        return jids

    def push_chunk_now(self, spec: JobSpec | None, chunk: list[Payload]) -> list[str | None]:
        """Each job through the chain, then one write for those it kept. If anything
        raises, the chunk counts as not written: middleware give back what they reserved
        for it (unique locks, places in a batch) before the error goes on. (A write that
        failed part-way, on one of several queues, may have pushed some jobs; those run
        outside the batch and without a lock, as after a single push that raised.) A push that
        replicas did not confirm in time (``NotReplicated``) was written: nothing is given
        back."""
        try:
            steps = self.middleware.for_chunk(spec, chunk[0], self.redis) if chunk else []
            self.middleware.prepare_bulk(spec, chunk, self.redis)
            kept = [
                self.middleware.invoke(spec, payload, self.redis, _keep, steps)
                for payload in chunk
            ]
            self.raw_push(payload for payload in kept if payload)
        except BaseException as error:
            if not was_written(error):  # pushed all the same: the reservations stand
                self.middleware.abandon_bulk(spec, chunk, self.redis)
            raise
        return [payload["jid"] if payload else None for payload in kept]

    def raw_push(self, payloads: Iterable[Payload]) -> None:
        """Write payloads that already went through the middleware chain."""
        batch = list(payloads)
        check_all(batch, self.strict_args)
        if batch:
            retry_on_failover(self.redis, lambda: self._write(batch))

    def _push_one(self, payload: Payload) -> Payload:
        self.raw_push([payload])
        return payload

    def _write(self, payloads: list[Payload]) -> None:
        wait = replication.of(self.redis)
        if wait is None and self._direct:
            commands = write_commands(payloads, keys.of(self.redis))
            send_packed_all(self.redis, [pack_command(*command) for command in commands])
            return
        pipe = pipeline(self.redis)
        queue_write(pipe, payloads)
        if wait is not None:
            pipe.wait(wait.replicas, wait.timeout_ms)
        replies = pipe.execute()
        if wait is not None:
            check_replicated(replies, wait, payloads)

    @functools.cached_property
    def _direct(self) -> bool:
        """Whether pushes may be written as packed commands on a connection from the
        client's pool (a standalone ``redis.Redis``), not through a redis-py pipeline."""
        client = self.redis
        return (
            isinstance(client, redis_py.Redis)
            and isinstance(client.connection_pool, redis_py.ConnectionPool)
            and not is_cluster(client)
        )


def check_replicated(
    replies: list[Any], wait: replication.ReplicaWait, pushed: list[Payload]
) -> None:
    """After a write whose pipeline ended with ``WAIT``: raise ``NotReplicated``, naming
    the jobs, when too few replicas confirmed it."""
    if not replication.confirmed(replies, wait):
        message = replication.shortfall(wait, int(replies[-1]), plugins.describe(pushed))
        raise replication.NotReplicated(message)


def queue_write(pipe: Any, payloads: list[Payload]) -> None:
    """Queue the write of ``payloads`` (see :func:`write_commands`) on ``pipe``, a sync or
    an asyncio pipeline (their command methods queue without I/O alike)."""
    for command in write_commands(payloads, keys.of(pipe)):
        if command[0] == "PUBLISH":  # by its method: a cluster pipeline publishes after
            pipe.publish(*command[1:])
        else:
            pipe.execute_command(*command)


def write_commands(payloads: list[Payload], layout: keys.KeyLayout) -> list[tuple[Any, ...]]:
    """The commands that write ``payloads``: scheduled jobs in one ZADD and one PUBLISH of
    the earliest time, immediate ones as SADD + LPUSH + PUBLISH per queue. Stamps
    ``enqueued_at`` on the immediate payloads."""
    now = clock.now()
    scheduled: dict[str, float] = {}
    immediate: dict[str, list[str]] = {}
    for payload in payloads:
        at = payload.get("at")
        if at is not None:
            body = {k: v for k, v in payload.items() if k != "at"}
            scheduled[dumps(body)] = float(at)
        else:
            payload["enqueued_at"] = now
            immediate.setdefault(payload["queue"], []).append(dumps(payload))
    commands: list[tuple[Any, ...]] = []
    if scheduled:
        pairs = [part for body, at in scheduled.items() for part in (at, body)]
        commands.append(("ZADD", layout.SCHEDULE, *pairs))
        commands.append(("PUBLISH", keys.DUE_CHANNEL, repr(min(scheduled.values()))))
    for queue, bodies in immediate.items():
        commands.append(("SADD", layout.QUEUES, queue))
        commands.append(("LPUSH", layout.queue(queue), *bodies))
        commands.append(("PUBLISH", keys.WAKE_CHANNEL, queue))  # idle capsules start it
    return commands


def check_all(payloads: Iterable[Payload], strict_args: str) -> None:
    """Every payload's arguments must survive JSON (see ``limitd.payload.check_args``)."""
    for payload in payloads:
        check_args(payload["class"], payload["args"], strict_args)


def bulk_chunks(
    item: Payload, args_list: Sequence[list[Any]], batch_size: int, spec: JobSpec | None
) -> Iterator[list[Payload]]:
    """The payloads of a bulk push, normalized, ``batch_size`` at a time. What all the
    jobs share is normalized once; each job gets its own args and jid (unless the item
    names one) and the chunk's ``created_at``."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    shared = normalize({**item, "args": []}, spec)
    own_jid = "jid" not in item
    for start in range(0, len(args_list), batch_size):
        shared["created_at"] = clock.now() if "created_at" not in item else item["created_at"]
        chunk = []
        for args in args_list[start : start + batch_size]:
            if not isinstance(args, list):
                raise ValueError(
                    f"job {shared['class']}: 'args' must be a list, got {type(args).__name__}"
                )
            payload = {**shared, "args": args}
            if own_jid:
                payload["jid"] = new_jid()
            chunk.append(payload)
        yield chunk


def _keep(payload: Payload) -> Payload:
    """End of the chain for bulk pushes: the chunk is written once, after the loop."""
    return payload


def normalize(item: Payload, spec: JobSpec | None = None) -> Payload:
    """A complete payload from a partial one: job options as defaults, then jid,
    ``created_at``, ``queue`` and ``retry`` when missing. Rejects what no server could
    run, at the caller, where the mistake is."""
    payload: Payload = {**(spec.options if spec else {}), **item}
    if not isinstance(payload.get("class"), str) or not payload["class"]:
        raise ValueError(f"job must have a non-empty 'class' string, got {item.get('class')!r}")
    if not isinstance(payload.get("args"), list):
        raise ValueError(
            f"job {payload['class']}: 'args' must be a list, "
            f"got {type(payload.get('args')).__name__}"
        )
    payload.setdefault("queue", DEFAULT_QUEUE)
    payload.setdefault("retry", True)
    payload.setdefault("jid", new_jid())
    payload.setdefault("created_at", clock.now())
    return payload


_default: Client | None = None
_default_lock = threading.Lock()


def default_client() -> Client:
    """The process-wide client, built on first use for the Redis that
    :func:`limitd.locate.app_location` finds (the order every entry point follows), with
    the named config's feature settings (``fair_tenant``). If that raises, the next use
    tries again."""
    global _default
    with _default_lock:
        if _default is None:
            _default = client_for(app_location())
        return _default


def connection_or_default(redis: redis_py.Redis | None) -> redis_py.Redis:
    """The caller's connection, else the default client's: an operator's shell sets one
    client once and every admin function (the API's and each feature's) picks it up."""
    return redis if redis is not None else default_client().redis


def client_for(where: Location) -> Client:
    """A client with the default middleware for a located Redis and its config."""
    sections = where.config.sections if where.config is not None else None
    return Client(connect_to(where), middleware=default_client_chain(sections))


def redis_client() -> redis_py.Redis:
    """The Redis this process's jobs run against, for a job's own work (counters,
    caches, locks), as ``Sidekiq.redis`` is in Ruby: in a ``limitd start`` capsule, the
    capsule's server; elsewhere, the default client's. Each thread sends over a
    connection of its own, made on first use (see :mod:`limitd.pinned`); pipelines and
    pub/sub use the default client's pool. A full ``redis.Redis`` (a cluster client in
    cluster mode)::

        @limitd.job
        def count_visit(page: str) -> None:
            limitd.redis_client().incr(f"visits:{page}")

    Replies are ``bytes``, as redis-py's are by default (``decode_responses=False``):
    ``get`` gives ``b"3"``, ``smembers`` a set of bytes. Ruby's client (and so
    ``Sidekiq.redis``) gives strings. limitd's own commands share this client's
    connections and read bytes, so it has no switch for that: decode what you read
    (``value.decode()``), or, for a client that decodes, open one of your own with
    ``redis.Redis.from_url(url, decode_responses=True)`` on the same URL.
    """
    client = _default  # read without the lock: jobs call this once or more each
    return (client if client is not None else default_client()).job_redis


def set_default_client(client: Client | None) -> None:
    """Replace the process-wide client (None: build a new one on next use)."""
    global _default
    with _default_lock:
        _default = client


def configure(*paths: str | Path, url: str | None = None) -> Client:
    """Make the default client use the Redis these config files name (and their
    ``fair_tenant`` settings, under any ``LIMITD_FAIR_TENANT_*`` variables)::

        limitd.configure("conf/example.yml")
        send_report.perform_async(42)

    The app's way to name its config in code rather than with ``LIMITD_CONFIG``:
    ``paths`` take that variable's place, ``url`` (like ``LIMITD_REDIS_URL``) wins over
    the files' Redis. Raises ``limitd.locate.RedisNotFound`` when the files name no
    ``redis.url`` and their embedded Redis is not running: another Redis would hold
    jobs their workers never see."""
    client = client_for(app_location(url, paths))
    set_default_client(client)
    return client
