"""The worker processes Redis knows about, as Sidekiq's web UI lists them.

Every running capsule process keeps a record (see ``limitd.supervisor.heartbeat``): its
identity in the ``processes`` set, and a hash named by the identity with ``info`` (JSON:
hostname, pid, tag, capsule, concurrency, queues...), ``busy``, ``beat`` and ``quiet``.
The hash expires when the process stops beating; the identity stays in ``processes``
until a poller's cleanup drops it, so this snapshot skips identities without a hash
rather than showing a dead process. Records written by Ruby Sidekiq are read the same
way (fields limitd adds, such as ``capsule``, are then None)::

    from limitd.api import Processes

    for process in Processes():
        print(process.identity, process.busy, process.concurrency, process.seconds_since_beat)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import redis as redis_py

from limitd import clock, keys
from limitd.client import connection_or_default
from limitd.connection import decode_name, set_members

RECORD_FIELDS = ("info", "busy", "beat", "quiet")


@dataclasses.dataclass(frozen=True)
class ProcessStatus:
    """One live process record. ``busy``: jobs it runs now, out of ``concurrency``.
    ``seconds_since_beat``: age of its last heartbeat when the snapshot was read (a
    healthy process beats every heartbeat period). ``info``: the whole ``info`` JSON,
    for fields not modelled here (labels, version, weights)."""

    identity: str
    hostname: str | None
    pid: int | None
    tag: str | None
    capsule: str | None
    capsule_id: str | None
    concurrency: int | None
    cpus: str | None  # the CPUs it may run on ("0-3"), see ``cpu_affinity``
    queues: list[str]
    busy: int
    quiet: bool
    beat: float | None
    seconds_since_beat: float | None
    started_at: float | None
    info: dict[str, Any] = dataclasses.field(repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """The modelled fields as plain data, for JSON output (``info`` left out)."""
        row = dataclasses.asdict(self)
        del row["info"]
        return row


SIGNAL_TTL = 60  # seconds a signal waits for its process (Sidekiq's too)


class Processes:
    """A snapshot of every live process record, sorted by identity, read when built and
    on ``refresh()``: two round trips however many processes there are (the identities;
    then one pipelined HMGET per identity)."""

    processes: list[ProcessStatus]

    def __init__(self, redis: redis_py.Redis | None = None) -> None:
        self.redis = connection_or_default(redis)
        self.refresh()

    def refresh(self) -> None:
        k = keys.of(self.redis)
        identities = set_members(self.redis, k.PROCESSES)
        pipe = self.redis.pipeline(transaction=False)
        for identity in identities:
            pipe.hmget(identity, RECORD_FIELDS)
        records = pipe.execute()
        now = clock.now()
        self.processes = [
            _status(identity, record, now)
            for identity, record in zip(identities, records, strict=True)
            if record[0] is not None  # expired hash: the process is gone
        ]

    @property
    def busy(self) -> int:
        """Jobs running in all processes together."""
        return sum(process.busy for process in self.processes)

    @property
    def concurrency(self) -> int:
        """Threads in all processes together."""
        return sum(process.concurrency or 0 for process in self.processes)

    def quiet(self, identity: str) -> bool:
        """Ask one process to take no new jobs (TSTP, as Sidekiq Web's Quiet). It acts at
        its record's next write, within 5 s. False if no live process has that identity."""
        return self._signal(identity, "TSTP")

    def stop(self, identity: str) -> bool:
        """Ask one process to stop gracefully (TERM, as Sidekiq Web's Stop). A process
        under ``limitd start`` passes it to its supervisor, which stops every process it
        runs (one child alone would be restarted). False if no live process has it."""
        return self._signal(identity, "TERM")

    def restart(self, identity: str) -> bool:
        """Ask for a rolling restart of the supervisor that runs this process (USR2, as
        Sidekiq Enterprise's): it replaces each of its processes, one at a time, with one
        that imports the app anew. One request per supervisor: a request that reaches it
        during a roll is ignored. False if no live process has that identity."""
        return self._signal(identity, "USR2")

    def _signal(self, identity: str, name: str) -> bool:
        if not self.redis.exists(identity):
            return False
        pipe = self.redis.pipeline(transaction=True)
        pipe.lpush(keys.process_signals(identity), name)
        pipe.expire(keys.process_signals(identity), SIGNAL_TTL)
        pipe.execute()
        return True

    def __iter__(self) -> Iterator[ProcessStatus]:
        return iter(self.processes)

    def __len__(self) -> int:
        return len(self.processes)

    def __repr__(self) -> str:
        return f"<Processes {[process.identity for process in self.processes]}>"


def _status(identity: str, record: list[bytes | None], now: float) -> ProcessStatus:
    """One record, tolerant of missing or odd fields: a listing must not fail because
    one process (or another Sidekiq implementation) wrote something unexpected."""
    raw_info, busy, beat, quiet = record
    info = _info(raw_info)
    beat_at = _number(beat)
    queues = info.get("queues")
    return ProcessStatus(
        identity=identity,
        hostname=_str_or_none(info.get("hostname")),
        pid=_int_or_none(info.get("pid")),
        tag=_str_or_none(info.get("tag")),
        capsule=_str_or_none(info.get("capsule")),
        capsule_id=_str_or_none(info.get("capsule_id")),
        concurrency=_int_or_none(info.get("concurrency")),
        cpus=_str_or_none(info.get("cpus")),
        queues=[str(queue) for queue in queues] if isinstance(queues, list) else [],
        busy=int(_number(busy) or 0),
        quiet=quiet is not None and decode_name(quiet) == "true",
        beat=beat_at,
        seconds_since_beat=None if beat_at is None else max(0.0, now - beat_at),
        started_at=_number(info.get("started_at")),
        info=info,
    )


def _info(raw: bytes | None) -> dict[str, Any]:
    try:
        info = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _number(value: object) -> float | None:
    if isinstance(value, bytes):
        value = decode_name(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _int_or_none(value: object) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None
