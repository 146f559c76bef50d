"""How the limit fetch spreads load over Redis Cluster shards: drain rates and Redis CPU
per job with 1, 2 and 3 primary shards (no replicas).

    .venv/bin/python bench/cluster.py [--rounds 3] [--jobs 20000] [--processes 2]
        [--threads 10] [--order random] [--deadline 180]

Each round builds a fresh cluster on free ports (``redis-cli --cluster create`` refuses
fewer than 3 primaries, so the slots are split evenly here with CLUSTER ADDSLOTSRANGE
and the nodes joined with CLUSTER MEET), pushes the jobs spread evenly over 6 queues,
then starts ``limitd start`` (P processes x T threads, fetch: limit with a limit of
1,000 per queue, above P x T so it is checked and never binds; logging at WARNING). The
queue names are picked so their keys fall 3 + 3 on 2 shards and 2 + 2 + 2 on 3 shards;
the global ``{limitd}`` keys live on one shard. --order random (the default) gives every
queue weight 1: each fetch draws a fresh order, so all shards work at once. --order
strict lists them unweighted: the queues drain one after another (an emptied queue is
asked again only after 100 ms or a wake-up naming it, see limitd.fetch.limit).

Each job INCRs a counter in its queue's slot (``bench:{QUEUE}:done``), read every 20
ms. Worker start-up is left out: the window runs from the first poll that sees a job
done to the poll that sees the last one; jobs/s and each primary's CPU (INFO cpu, user
+ sys) per job are taken over that window. Shard counts alternate (1, 2, 3, 1, 2, 3,
...); medians over the rounds are printed. Everything shares the machine, so the rate
need not grow with shards; the Redis CPU per job on each shard shows the spread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

import redis as redis_py
from _common import redis_cpu_seconds
from redis.cluster import RedisCluster, key_slot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.topologies

import limitd
from limitd import keys
from limitd.connection import connect
from tests.helpers import LimitdProcesses, wait_for
from tests.topologies import ClusterGroup

SLOTS = 16384
SHARD_COUNTS = (1, 2, 3)
POLL_SECONDS = 0.02
LIMIT = 1000  # above processes x threads: checked, never binding

APP = """
import limitd
from limitd.client import default_client

def make(queue):
    @limitd.job(name="bench.cluster." + queue, queue=queue)
    def work(n):
        default_client().redis.incr("bench:{" + queue + "}:done")
    return work

jobs = [make(q) for q in QUEUE_NAMES]
"""


def shard_of(name: str, shards: int) -> int:
    """The shard (as numbered here) serving the slot of hash tag ``name``."""
    slot = key_slot(name.encode())
    return max(i for i in range(shards) if i * SLOTS // shards <= slot)


def pick_queues() -> list[str]:
    """6 names, 3 + 3 on 2 shards and 2 + 2 + 2 on 3 shards."""
    wanted = {(0, 0): 2, (0, 1): 1, (1, 1): 1, (1, 2): 2}  # (shard of 2, shard of 3): count
    picked: list[str] = []
    for n in range(10_000):
        where = (shard_of(f"q{n}", 2), shard_of(f"q{n}", 3))
        if wanted.get(where, 0) > 0:
            wanted[where] -= 1
            picked.append(f"q{n}")
    return sorted(picked, key=lambda q: (shard_of(q, 3), q))


QUEUES = pick_queues()


def start_cluster(group: ClusterGroup) -> None:
    nodes = group.nodes
    for node in nodes:
        node.start()
    for i, node in enumerate(nodes):
        conn = node.client()
        conn.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        first, last = i * SLOTS // len(nodes), (i + 1) * SLOTS // len(nodes) - 1
        conn.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        for other in nodes[:i]:
            conn.execute_command("CLUSTER", "MEET", "127.0.0.1", other.port)
        conn.close()

    def ready() -> bool:
        for node in nodes:
            conn = node.client()
            try:
                info = conn.cluster("info")
            finally:
                conn.close()
            if info.get("cluster_state") != "ok" or int(info["cluster_known_nodes"]) != len(nodes):
                return False
        return True

    wait_for(ready, timeout=30, message="the cluster is ok on every node")


def one_round(shards: int, args: argparse.Namespace) -> tuple[float, list[float]]:
    """Jobs/s and each primary's Redis CPU microseconds per job, over the window."""
    per_queue = args.jobs // len(QUEUES)
    total = per_queue * len(QUEUES)
    with tempfile.TemporaryDirectory(prefix="limitd-cluster-bench-") as tmp:
        base = Path(tmp)
        group = ClusterGroup(base / "cluster", masters=shards, replicas_each=0)
        workers = LimitdProcesses(base, group.url)
        primaries: list[redis_py.Redis] = []
        try:
            start_cluster(group)
            conn = connect(group.url)
            for queue in QUEUES:  # the shards as numbered here are the cluster's
                port = cast(RedisCluster, conn).get_node_from_key(keys.of(conn).queue(queue)).port
                if port != group.nodes[shard_of(queue, shards)].port:
                    raise RuntimeError(f"{queue} is not on shard {shard_of(queue, shards)}")
            client = limitd.Client(conn)
            for queue in QUEUES:
                item = {"class": f"bench.cluster.{queue}", "queue": queue}
                client.push_bulk(item, [[n] for n in range(per_queue)])
            (base / "cluster_app.py").write_text(APP.replace("QUEUE_NAMES", repr(QUEUES)))
            each = "[{}, 1]" if args.order == "random" else "{}"
            listed = "[" + ", ".join(each.format(q) for q in QUEUES) + "]"
            (base / "bench.yml").write_text(
                f"logging: {{level: WARNING}}\nrequire: [cluster_app]\nqueues: {listed}\n"
                f"concurrency: {args.threads}\nprocesses: {args.processes}\nfetch: limit\n"
                f"limits: {{{', '.join(f'{q}: {LIMIT}' for q in QUEUES)}}}\n"
            )
            workers.env["PYTHONPATH"] = str(base)
            primaries = [node.client() for node in group.nodes]
            workers.start(str(base / "bench.yml"))
            give_up = time.monotonic() + args.deadline

            def done() -> int:
                if time.monotonic() > give_up or workers.procs[0].poll() is not None:
                    log = (base / "limitd.log").read_text()[-2000:]
                    raise RuntimeError(f"the drain did not finish; limitd.log ends:\n{log}")
                return sum(int(conn.get(f"bench:{{{q}}}:done") or 0) for q in QUEUES)

            while (first := done()) == 0:
                time.sleep(POLL_SECONDS)
            started = time.perf_counter()
            cpu_before = [redis_cpu_seconds(p) for p in primaries]
            while done() < total:
                time.sleep(POLL_SECONDS)
            seconds = time.perf_counter() - started
            cpu_after = [redis_cpu_seconds(p) for p in primaries]
            conn.close()
        finally:
            workers.kill_all()
            for p in primaries:
                p.close()
            group.stop()
    counted = total - first
    cpu_us = [(b - a) / counted * 1e6 for a, b in zip(cpu_before, cpu_after, strict=True)]
    return counted / seconds, cpu_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="drains per shard count (3)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (20000)")
    parser.add_argument("--processes", type=int, default=2, help="capsule processes (2)")
    parser.add_argument("--threads", type=int, default=10, help="threads per process (10)")
    parser.add_argument("--order", choices=["random", "strict"], default="random")
    parser.add_argument("--deadline", type=float, default=180.0, help="seconds per drain")
    args = parser.parse_args()
    total = args.jobs // len(QUEUES) * len(QUEUES)
    print(f"jobs: {total} over queues {', '.join(QUEUES)}, order {args.order}; ", end="")
    print(f"limitd start {args.processes} x {args.threads} threads; rounds {args.rounds}")
    for shards in SHARD_COUNTS[1:]:
        where = [[q for q in QUEUES if shard_of(q, shards) == s] for s in range(shards)]
        spread = "; ".join(f"shard {s}: {', '.join(qs)}" for s, qs in enumerate(where))
        print(f"{shards} shards: {spread}; {{limitd}} keys: shard {shard_of('limitd', shards)}")
    results: dict[int, list[tuple[float, list[float]]]] = {n: [] for n in SHARD_COUNTS}
    for number in range(1, args.rounds + 1):
        for shards in SHARD_COUNTS:
            rate, cpu_us = one_round(shards, args)
            results[shards].append((rate, cpu_us))
            per_shard = " ".join(f"{us:.0f}" for us in cpu_us)
            print(
                f"round {number} shards {shards}: {rate:,.0f} jobs/s, Redis us/job "
                f"{sum(cpu_us):.0f} (per shard: {per_shard})",
                flush=True,
            )
    print("\n| shards | jobs/s (median, min-max) | Redis CPU us/job total | "
          "max per-shard Redis CPU us/job |")  # fmt: skip
    print("|---|---|---|---|")
    for shards, runs in results.items():
        rates = [rate for rate, _ in runs]
        cpu_total = statistics.median(sum(cpu) for _, cpu in runs)
        cpu_max = statistics.median(max(cpu) for _, cpu in runs)
        print(
            f"| {shards} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-"
            f"{max(rates):,.0f}) | {cpu_total:.0f} | {cpu_max:.0f} |"
        )


if __name__ == "__main__":
    main()
