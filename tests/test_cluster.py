"""Redis Cluster mode on a real cluster (3 primaries with a replica each, made with
``redis-cli --cluster create`` on free ports): addresses and config, the checks that
refuse mixed layouts, every script call in one slot, ``limitd start`` draining queues
that live on different shards with exact limits, and a primary killed mid-run.

The core, limit-fetch, fair-tenant, unique and poller tests also run against the
cluster (``CLUSTER_MODULES`` in conftest.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from redis.cluster import key_slot

import limitd
from limitd import Limiter, keys
from limitd.config import ConfigError, load_config
from limitd.connection import LuaFunction, LuaScript, async_twin, cluster, connect, pipeline
from limitd.connection.embedded import RedisServer
from limitd.connection.wire import OwnConnection, own_connection
from limitd.fetch import liveness
from limitd.fetch.factory import limit_fetch
from limitd.queues import limits as queue_limits
from limitd.queues.order import QueueOrder
from limitd.supervisor import Capsule, CapsuleConfig
from tests.helpers import LimitdProcesses, wait_for
from tests.topologies import ClusterGroup, cluster_port


def take_one(fetch, done=None, **options):  # type: ignore[no-untyped-def]
    """One job (settling ``done`` in the same call), or None."""
    units = fetch.take(1, [done] if done is not None else [], **options)
    return units[0] if units else None


QUEUES = ["alpha", "beta", "gamma", "delta"]
ran: list[Any] = []


@limitd.job(name="cluster_test.Mark", unique_for=60)
def mark(n: int) -> None:
    ran.append(n)


@limitd.job(name="cluster_test.BatchDone", queue="gamma")
def mark_done(status: object, options: object) -> None:
    ran.append(("batch", "success"))


@limitd.job(name="cluster_test.Fails", retry=1)
def fails() -> None:
    raise RuntimeError("boom")


@limitd.job(
    name="cluster_test.Tenant",
    fair_tenant_queues=[{"queue": "alpha_slow", "threshold": 2, "per": 3600}],
)
def tenant_job(n: int) -> None:
    ran.append(("tenant", n))


def test_the_url_and_the_config_name_the_nodes(tmp_path: Path) -> None:
    where = cluster.parse("redis+cluster://:pw@a:7000,b:7001")
    assert where == cluster.ClusterAddress((("a", 7000), ("b", 7001)), "pw")
    for bad, words in [
        ("redis+cluster://", "at least one node"),
        ("redis+cluster://a", "host:port"),
        ("redis+cluster://a:1/3", "only database 0"),
    ]:
        with pytest.raises(ValueError, match=words):
            cluster.parse(bad)
    conf = tmp_path / "app.yml"
    conf.write_text("redis: {cluster: true, startup_nodes: ['10.0.0.1:7000', '10.0.0.2:7000']}\n")
    assert load_config([str(conf)]).redis.url == "redis+cluster://10.0.0.1:7000,10.0.0.2:7000"
    conf.write_text("redis: {cluster: true}\n")
    with pytest.raises(ConfigError, match=r"redis\.startup_nodes"):
        load_config([str(conf)])
    conf.write_text("redis: {startup_nodes: ['a:1']}\n")
    with pytest.raises(ConfigError, match=r"redis\.startup_nodes.*cluster: true"):
        load_config([str(conf)])


def test_keys_of_one_queue_share_a_slot_and_queues_spread(clustered: redis_py.Redis) -> None:
    k = keys.of(clustered)
    assert k is keys.CLUSTER, "connect() attaches the cluster layout"
    for name in QUEUES:
        per_queue = [
            k.queue(name),
            k.limits_of(name),
            k.busy_of(name),
            k.in_progress("c1", name),
            k.rate_state(name),
            k.recoveries_of(name),
        ]
        assert len({key_slot(key.encode()) for key in per_queue}) == 1
    shards = {clustered.get_node_from_key(k.queue(name)).name for name in QUEUES}
    assert len(shards) >= 2, "the test's queues live on more than one shard"
    assert len({key_slot(key.encode()) for key in (k.SCHEDULE, k.RETRY, k.DEAD)}) == 1


def test_every_script_call_touches_one_slot(
    clustered: redis_py.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each script a workload runs (push, limit fetch, retries, the poller's moves,
    burying, reaping, unique locks, fair tenants, batches and their callbacks, limiters)
    is run for real here, on the
    cluster, which refuses a call whose keys span slots; the keys of every call are
    checked too."""
    calls: dict[str, set[int]] = {}

    def checking(kind: type[LuaScript]) -> Any:
        original = kind._on_cluster

        def checked(self: LuaScript, conn: Any, script_keys: Any, args: Any) -> Any:
            slots = {key_slot(k if isinstance(k, bytes) else str(k).encode()) for k in script_keys}
            assert len(slots) == 1, f"{self.name} spans slots: {list(script_keys)}"
            calls.setdefault(self.name, set()).update(slots)
            return original(self, conn, script_keys, args)

        return checked

    # (the limit fetch is a LuaFunction: an FCALL where Redis has functions)
    for kind in (LuaScript, LuaFunction):
        monkeypatch.setattr(kind, "_on_cluster", checking(kind))
    ran.clear()
    mark.set(queue="alpha").perform_async(1)
    mark.set(queue="beta").perform_async(2)
    assert mark.set(queue="beta").perform_async(2) is None, "unique"
    fails.set(queue="gamma").perform_async()
    for n in range(4):
        tenant_job.set(fair_tenant="acme").perform_async(n)
    queues = [*QUEUES, "default", "alpha_slow"]
    capsule = Capsule(CapsuleConfig(queues=queues), redis=clustered)
    assert capsule.drain(scheduled=True) == {"done": 6, "retry": 1}
    assert sorted(n for kind, n in (r for r in ran if isinstance(r, tuple))) == [0, 1, 2, 3]
    assert clustered.llen(keys.of(clustered).queue("alpha_slow")) == 0
    [waiting] = clustered.zrange(keys.of(clustered).RETRY, 0, 0)
    clustered.zadd(keys.of(clustered).RETRY, {waiting: 0})  # due now: the poller moves it
    assert capsule.drain(scheduled=True) == {"dead": 1}
    clustered.zadd(
        keys.of(clustered).SCHEDULE, {b"not json": 0}
    )  # unreadable: buried by the poller
    capsule.drain(scheduled=True)
    assert clustered.zcard(keys.of(clustered).DEAD) == 2
    batch = limitd.Batch("cluster")
    batch.on("success", mark_done)
    with batch.jobs():
        mark.set(queue="gamma").perform_async(20)
        mark.set(queue="delta").perform_async(21)
    assert capsule.drain() == {"done": 3}, "the two jobs, then the callback"
    assert ("batch", "success") in ran
    limiter = Limiter.concurrent("cluster-api", 1, redis=clustered)
    with limiter.within_limit():
        pass
    # A capsule that died holding jobs of two queues on two shards is reaped.
    mark.set(queue="alpha").perform_async(10)
    mark.set(queue="delta").perform_async(11)
    dead = Capsule(CapsuleConfig(queues=QUEUES, concurrency=2), redis=clustered)
    held = [take_one(dead.fetch), take_one(dead.fetch)]
    assert all(held)
    liveness.vouch(clustered, [dead.id], 15)
    clustered.delete(keys.of(clustered).capsule_heartbeat(dead.id))
    assert liveness.reap_dead(clustered) == {dead.id: 2}
    expected = {
        "limit_fetch.lua", "unique_acquire.lua", "unique_release.lua", "fair_tenant.lua",
        "handoff_claim_member.lua", "bury_member.lua", "reap_capsule.lua",
        "limiter_concurrent_acquire.lua", "limiter_concurrent_release.lua",
        "batch_open.lua", "batch_add.lua", "batch_close.lua", "batch_job_settled.lua",
        "handoff_claim.lua",
    }  # fmt: skip
    assert expected <= calls.keys(), f"not exercised: {expected - calls.keys()}"
    assert len(set().union(*calls.values())) >= 3, "calls went to several slots"


def test_mixing_layouts_is_refused(clustered: redis_py.Redis, redis_server: Any) -> None:
    cluster.check_layout(clustered, cluster_mode=True)  # empty: fine
    clustered.sadd("queues", "default")  # what a standalone client or Sidekiq writes
    with pytest.raises(cluster.LayoutMismatch, match=r"standalone layout .*queues"):
        cluster.check_layout(clustered, cluster_mode=True)
    with pytest.raises(cluster.LayoutMismatch, match="cluster node"):
        cluster.check_layout(redis_py.Redis(port=_a_node_port(clustered)), cluster_mode=False)
    cluster.check_layout(redis_server.client(), cluster_mode=False)


def _a_node_port(client: Any) -> int:
    return int(client.get_primaries()[0].port)


APP = textwrap.dedent('''
    import os, time, limitd, redis
    from limitd.client import default_client

    # Where jobs record what they did: the cluster, or a separate Redis (the witness)
    # when the test takes the cluster's nodes down.
    URL = os.environ.get("WITNESS_URL")
    WITNESS = redis.Redis.from_url(URL) if URL else None

    ENTER = """
    local n = redis.call('INCR', KEYS[1])
    if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
    """

    def make(queue):
        @limitd.job(name=f"meter.{queue}", queue=queue)
        def work(n):
            r = WITNESS or default_client().redis
            tag = "{m:" + queue + "}"
            r.eval(ENTER, 2, tag + "running", tag + "peak")
            time.sleep(0.002)
            r.decr(tag + "running")
            r.sadd(tag + "done", n)
        return work

    jobs = [make(q) for q in ("alpha", "beta", "gamma", "delta")]
''')

LIMITS = {"alpha": 1, "beta": 2, "gamma": 3, "delta": 4}


def _start(tmp_path: Path, url: str, witness: str | None = None, *extra: str) -> LimitdProcesses:
    (tmp_path / "meter_app.py").write_text(APP)
    processes = LimitdProcesses(tmp_path, url)
    processes.env["PYTHONPATH"] = str(tmp_path)
    if witness is not None:
        processes.env["WITNESS_URL"] = witness
    flags = [f"--limit={queue}={limit}" for queue, limit in LIMITS.items()]
    queues = [arg for queue in QUEUES for arg in ("-q", queue)]
    processes.start("-r", "meter_app", *queues, "-p", "2", "-c", "6", *flags, *extra)
    return processes


def _push(conn: redis_py.Redis, count: int) -> None:
    client = limitd.Client(conn)
    for queue in QUEUES:
        client.push_bulk({"class": f"meter.{queue}", "queue": queue}, [[n] for n in range(count)])


def _done(conn: redis_py.Redis) -> int:
    return sum(int(conn.scard("{m:" + queue + "}done")) for queue in QUEUES)


def test_limitd_start_drains_queues_on_every_shard_with_exact_limits(
    clustered: redis_py.Redis, redis_cluster: ClusterGroup, tmp_path: Path
) -> None:
    processes = _start(tmp_path, redis_cluster.url)
    try:
        _push(clustered, 250)
        wait_for(lambda: _done(clustered) == 1000, timeout=120, message="1000 jobs")
        # A job counts itself done before its processor settles it (with its next
        # take): the last slots are freed a moment later, sooner than a loaded machine
        # may let the kill below wait.
        wait_for(
            lambda: all(queue_limits.busy(clustered, queue) == 0 for queue in LIMITS),
            timeout=30,
            message="every slot freed",
        )
    finally:
        processes.kill_all()
    for queue, limit in LIMITS.items():
        assert int(clustered.get("{m:" + queue + "}peak")) == limit, queue
        assert queue_limits.busy(clustered, queue) == 0


def test_start_refuses_a_cluster_it_cannot_reach_or_mixed_layouts(
    clustered: redis_py.Redis, redis_cluster: ClusterGroup, redis_server: Any, tmp_path: Path
) -> None:
    silent = f"redis+cluster://127.0.0.1:{cluster_port()}"
    proc = LimitdProcesses(tmp_path, silent).start("-r", "json")
    assert proc.wait(30) == 69
    assert "none of the cluster nodes answered: 127.0.0.1:" in _last_line(tmp_path)
    clustered.sadd("queues", "default")  # a standalone layout in the cluster
    proc = LimitdProcesses(tmp_path, redis_cluster.url).start("-r", "json")
    assert proc.wait(30) == 78
    assert "holds keys of the standalone layout (queues)" in _last_line(tmp_path)
    node = f"redis://127.0.0.1:{_a_node_port(clustered)}/0"  # a cluster node, as one Redis
    proc = LimitdProcesses(tmp_path, node).start("-r", "json")
    assert proc.wait(30) == 78
    assert "this Redis is a cluster node" in _last_line(tmp_path)


def _last_line(tmp_path: Path) -> str:
    return (tmp_path / "limitd.log").read_text().strip().splitlines()[-1]


def test_a_primary_killed_mid_run_fails_over_without_losing_jobs(tmp_path: Path) -> None:
    """Its own cluster (this one loses a node). Jobs are pushed and replicated first;
    the primary of one queue is SIGKILLed while they run; its replica takes over and
    every job runs (a fetch or acknowledgement the replica had not received makes a job
    run twice: counted, not failed)."""
    group = ClusterGroup(tmp_path / "nodes", node_timeout_ms=1000)
    group.start()
    witness = RedisServer()
    witness.start()
    counts = witness.client()
    conn = connect(group.url)
    processes: LimitdProcesses | None = None
    try:
        _push(conn, 500)
        _wait_replicated(group)
        processes = _start(tmp_path, group.url, witness.url, "--heartbeat-period", "2")
        wait_for(lambda: _done(counts) >= 400, timeout=60, message="jobs running")
        group.primary_of(keys.of(conn).queue("beta")).kill()
        wait_for(lambda: _done(counts) == 2000, timeout=120, message="every job after failover")
        wait_for(
            lambda: _answers(lambda: all(queue_limits.busy(conn, q) == 0 for q in QUEUES)),
            timeout=60,
            message="no slot left taken",
        )
    finally:
        if processes is not None:
            processes.kill_all()
        group.stop()
        witness.stop()


def _answers(check: Any) -> bool:
    """``check()``, False while the cluster is failing over under the test's client."""
    try:
        return bool(check())
    except (redis_py.ConnectionError, redis_py.ClusterDownError, redis_py.TimeoutError):
        return False


def _wait_replicated(group: ClusterGroup) -> None:
    def caught_up() -> bool:
        for node in group.nodes:
            info = node.client().info("replication")
            if info["role"] == "master" and any(
                int(value["offset"]) < int(info["master_repl_offset"])
                for key, value in info.items()
                if key.startswith("slave")
            ):
                return False
        return True

    wait_for(caught_up, timeout=30, message="replicas caught up")


def test_a_queue_that_gave_nothing_is_skipped_until_a_wake_up_names_it(
    clustered: redis_py.Redis,
) -> None:
    """Each queue asked is a round trip to its shard: with wake-ups, a queue that just
    gave nothing is left alone for a moment (a long one here), unless one names it."""
    fetch = limit_fetch(clustered, QueueOrder(["alpha", "beta"]), "c1")
    fetch.quiet_seconds = 3600
    clustered.lpush(keys.of(clustered).queue("beta"), '{"class":"X","args":[1],"queue":"beta"}')
    assert take_one(fetch).queue == "beta"  # alpha was asked, and gave nothing
    clustered.lpush(keys.of(clustered).queue("alpha"), '{"class":"X","args":[2],"queue":"alpha"}')
    clustered.lpush(keys.of(clustered).queue("beta"), '{"class":"X","args":[3],"queue":"beta"}')
    assert take_one(fetch).queue == "beta", "alpha is quiet: not asked"
    fetch.woken("alpha")
    assert take_one(fetch).queue == "alpha"


# Names in ``keys`` that are the same in both layouts: a template whose key gets its
# tag when formatted, and the marker of a child batch in its parent's sets.
LAYOUT_FREE = {"FAIR_TENANT_DEFAULT_KEY", "FAIR_TENANT_PLACEHOLDERS", "BATCH_CHILD_PREFIX"}
# Module constants that start with ``limitd:`` but name no key: the marker that opens a
# sealed argument in a payload (``limitd:aes256gcm:v2:...``, a value in ``args``).
NOT_KEYS = {("encryption/cipher.py", "PREFIX")}


def test_the_key_layout_travels_with_the_connection(
    clustered: redis_py.Redis, redis_server: RedisServer
) -> None:
    """No process-wide layout: each client, pipeline and own connection answers for
    itself, so a process may hold a standalone and a cluster client at once."""
    plain = redis_server.client()  # built by hand, as tests and users do: standalone
    attached = connect(redis_server.url)
    for conn, layout in ((plain, keys.STANDALONE), (attached, keys.STANDALONE)):
        assert keys.of(conn) is layout
        assert keys.of(conn.pipeline()) is layout
        assert keys.of(pipeline(conn)) is layout
        assert keys.of(OwnConnection(conn)) is layout
        assert keys.of(async_twin(conn)) is layout
    assert keys.of(clustered) is keys.CLUSTER
    assert keys.of(clustered.pipeline()) is keys.CLUSTER
    assert keys.of(pipeline(clustered)) is keys.CLUSTER  # the PUBLISH-after wrapper
    assert keys.of(own_connection(clustered)) is keys.CLUSTER
    assert keys.of(async_twin(clustered)) is keys.CLUSTER
    assert keys.STANDALONE.queue("mail") == "queue:mail"  # the two layouts side by side
    assert keys.CLUSTER.queue("mail") == "queue:{mail}"
    assert keys.CLUSTER.SCHEDULE == "{limitd}schedule" and keys.STANDALONE.SCHEDULE == "schedule"
    with pytest.raises(AttributeError):
        keys.CLUSTER.SCHEDULE = "schedule"  # type: ignore[misc]
    plain.close()
    attached.close()


def test_no_module_or_class_names_a_key_at_import() -> None:
    """Key names depend on the layout of the connection they are used on: ``keys``
    keeps no layout of its own (no module constant of a layout's names, no switch), and
    no module or class builds a name at import (from a layout, or by hand with the
    ``limitd:`` prefix). Every such name is read, from its connection, when used."""
    import ast

    layout_names = set(keys.KeyLayout.__slots__) - {"LIMITD_PREFIX"}  # the standalone one
    assert not layout_names & set(vars(keys)), "keys names a layout's key at module level"
    assert not {"use_cluster_layout", "is_cluster_layout", "_cluster"} & set(vars(keys))
    root = Path(limitd.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "keys.py" or path == root / "connection" / "cluster.py":  # the
            continue  # standalone names it looks for, on purpose
        tree = ast.parse(path.read_text())
        scopes = [tree, *(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef))]
        for scope in scopes:
            for statement in scope.body:
                if not isinstance(statement, ast.Assign | ast.AnnAssign):
                    continue
                targets = (
                    statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                )
                named = {target.id for target in targets if isinstance(target, ast.Name)}
                if any((str(path.relative_to(root)), name) in NOT_KEYS for name in named):
                    continue
                for node in ast.walk(statement):
                    if (
                        isinstance(node, ast.Attribute)
                        and isinstance(node.value, ast.Name)
                        and node.value.id == "keys"
                        and (node.attr.isupper() or node.attr == "of")
                        and not node.attr.endswith(("_CHANNEL", "_TTL", "_PARTS", "_PREFIX"))
                        and node.attr not in LAYOUT_FREE
                    ) or (
                        (isinstance(node, ast.Attribute) and node.attr == "LIMITD_PREFIX")
                        or (
                            isinstance(node, ast.Constant)
                            and isinstance(node.value, str)
                            and node.value.startswith("limitd:")
                        )
                    ):
                        found.append(f"{path.relative_to(root)}:{statement.lineno}")
    assert found == []
