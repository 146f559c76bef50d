"""Tenant fairness with a real capsule: how long small tenants wait behind a greedy one.

    .venv/bin/python bench/fairness.py [--greedy-jobs 20000] [--small-tenants 10]
        [--small-jobs 20] [--threads 10] [--work-ms 1.0] [--rounds 5]
        [--spread SECONDS] [--redis URL]

One in-process capsule (limit fetch, --threads threads, queues weighted
``[default, 4], [throttled_2x, 2], [throttled_4x, 1]``) runs the same work two ways:

- fifo: a job without rules, pushed by a client with an empty middleware chain: every
  job lands in ``default`` and runs in push order;
- fair: the same job defined with the ``fair_tenant_queues`` rules in ``RULES``, pushed
  by a client with the default chain (the fair_tenant middleware): past its first 100
  jobs the greedy tenant is rerouted to the throttled queues; small tenants never are.

In each run a greedy tenant pushes --greedy-jobs jobs in one ``perform_bulk`` burst,
while --small-tenants tenants push --small-jobs jobs each, one at a time from a thread
per tenant, evenly spaced over --spread seconds (default: 70% of the FIFO drain,
estimated from a short calibration drain; the same schedule in every run). Each job
sleeps --work-ms (work that releases the GIL, like I/O) and records when it started and
ended; jobs run in threads of this process, so these times compare directly with the
producers' push times. The two modes alternate for --rounds rounds (fifo, fair, fair,
fifo, ...) because the machine drifts; each run gets a fresh capsule and empty queues.

Prints a row per run and per mode (all rounds): the small tenants' wait, from just
before their ``perform_async`` to the job's first line, p50, p99 and max; the median
duration of those ``perform_async`` calls; the greedy tenant's drain time, from the
start of its burst to the end of its last job; how long the burst took to enqueue; the
capsule's rate (all tenants) from the end of that enqueue to the end of the drain, when
the producer no longer competes for this process's GIL; and when the last small push
came, as a share of the drain. Then the ratios against the targets: small tenants'
p99 fifo/fair >= 10x (waits pooled over the rounds), greedy drain fair/fifo within 10%
(the median of the rounds' ratios: a round's two runs are adjacent, so they share the
machine's drift, which moves drains by 10-20%); the fair waits split by whether the
push came while the burst was still being enqueued; and the queues the jobs ran from,
beside the middleware's own reroute counts.

Without --redis it starts a private redis-server. With --redis, use a scratch
database: each run empties the queues default, throttled_2x and throttled_4x.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis as redis_py
from _common import redis_for_bench

import limitd
from limitd import keys
from limitd.fair_tenant.middleware import FairTenantSettings
from limitd.middleware import ClientChain
from limitd.supervisor import Capsule, CapsuleConfig

JOB_NAME = "bench.FairWork"
FIFO_JOB_NAME = "bench.FifoWork"
QUEUES: list[list[Any]] = [["default", 4], ["throttled_2x", 2], ["throttled_4x", 1]]
QUEUE_NAMES = [str(name) for name, _ in QUEUES]
RULES = [
    {"queue": "throttled_2x", "threshold": 100, "per": 60},
    {"queue": "throttled_4x", "threshold": 1000, "per": 60},
]
GREEDY = "greedy"
CALIBRATION = "calibration"
CALIBRATION_JOBS = 2000
SPREAD_SHARE = 0.7  # small tenants push over this share of the estimated FIFO drain
MODES = ("fifo", "fair")
STOP_TIMEOUT = 5.0
WAIT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Ran:
    tenant: str
    seq: int
    queue: str
    started: float
    ended: float


class Recorder:
    """What the jobs of the current run did; shared by the job and the producers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all_done = threading.Event()
        self.work_seconds = 0.0
        self.expected = 0
        self.pushed: dict[tuple[str, int], float] = {}
        self.returned: dict[tuple[str, int], float] = {}
        self.ran: list[Ran] = []

    def begin(self, expected: int, work_seconds: float) -> None:
        with self._lock:
            self.expected = expected
            self.work_seconds = work_seconds
            self.pushed = {}
            self.returned = {}
            self.ran = []
            self._all_done.clear()

    def push_time(self, tenant: str, seq: int) -> None:
        self.pushed[(tenant, seq)] = time.perf_counter()

    def return_time(self, tenant: str, seq: int) -> None:
        self.returned[(tenant, seq)] = time.perf_counter()

    def record(self, entry: Ran) -> None:
        with self._lock:
            self.ran.append(entry)
            if len(self.ran) >= self.expected:
                self._all_done.set()

    def wait(self, timeout: float) -> None:
        if not self._all_done.wait(timeout):
            raise TimeoutError(f"{len(self.ran)} of {self.expected} jobs ran in {timeout:.0f} s")


recorder = Recorder()


def perform(tenant: str, seq: int) -> None:
    """The job: sleep (work that releases the GIL, like I/O) and say what happened."""
    started = time.perf_counter()
    time.sleep(recorder.work_seconds)
    payload = limitd.current_payload()
    queue = str(payload["queue"]) if payload else "?"
    recorder.record(Ran(tenant, seq, queue, started, time.perf_counter()))


# The same work twice: with rules (fair), and plain (fifo: no rules in its payload, so
# both runs parse payloads of about the same size).
fair_work = limitd.job(
    perform,
    name=JOB_NAME,
    queue="default",
    tenant=lambda tenant, _seq: tenant,
    fair_tenant_queues=RULES,
)
fifo_work = limitd.job(perform, name=FIFO_JOB_NAME, queue="default")


@dataclass(frozen=True)
class SmallPlan:
    """Small tenants' pushes: push m (0-based) at ``(m + 0.5) / total * spread`` seconds
    after the burst starts, by tenant ``m % tenants``: evenly spaced, tenants interleaved."""

    tenants: int
    jobs: int
    spread: float

    @property
    def total(self) -> int:
        return self.tenants * self.jobs

    def schedule(self, tenant: int) -> list[tuple[int, float]]:
        """(seq, offset in seconds) of one tenant's pushes."""
        pushes = range(tenant, self.total, self.tenants)
        return [(m // self.tenants, (m + 0.5) / self.total * self.spread) for m in pushes]


def small_name(index: int) -> str:
    return f"small-{index:02d}"


@dataclass(frozen=True)
class Workload:
    threads: int
    work_seconds: float
    greedy: str  # the greedy tenant's name
    greedy_jobs: int
    plan: SmallPlan


@dataclass
class RunResult:
    mode: str
    small_waits: list[float]
    small_pushed: list[float]  # when each of those was pushed, seconds after the burst began
    push_calls: list[float]  # seconds each small tenant's perform_async took
    greedy_drain: float
    burst: float
    pushes_end: float  # the last small push, seconds after the burst started
    rate_after_burst: float  # jobs/s (every tenant's) from the burst's end to the drain's
    queues: dict[str, Counter[str]] = field(default_factory=dict)  # tenant kind -> queue
    reroutes: Counter[str] = field(default_factory=Counter)


def capsule_config(threads: int) -> CapsuleConfig:
    return CapsuleConfig(queues=QUEUES, concurrency=threads)


def tenants(plan: SmallPlan) -> list[str]:
    return [GREEDY, *(small_name(i) for i in range(plan.tenants))]


def reset(conn: redis_py.Redis, names: Sequence[str]) -> None:
    """Empty the queues and forget this job's fair_tenant counts, so each run starts with
    no tenant over a threshold (the counts outlive a run: the middleware keeps them for
    max_throttling_window, a day by default, even though the rules look back 60 s)."""
    template = FairTenantSettings.from_env().enqueues_key
    pipe = conn.pipeline(transaction=False)
    for queue in QUEUE_NAMES:
        pipe.delete(keys.of(conn).queue(queue))
    for tenant in names:  # counted under the job's own queue, before any reroute
        pipe.delete(
            keys.of(conn).fair_tenant_enqueues(
                template, queue="default", job_class=JOB_NAME, tenant=tenant
            )
        )
    ours = [
        f for f in conn.hkeys(keys.of(conn).FAIR_TENANT_REROUTES) if json.loads(f)[0] == JOB_NAME
    ]
    if ours:
        pipe.hdel(keys.of(conn).FAIR_TENANT_REROUTES, *ours)
    pipe.execute()


def reroutes(conn: redis_py.Redis) -> Counter[str]:
    """The middleware's own count of this job's reroutes, per tenant kind and queue."""
    counts: Counter[str] = Counter()
    for raw, value in conn.hgetall(keys.of(conn).FAIR_TENANT_REROUTES).items():
        job, tenant, queue, _rule = json.loads(raw)
        if job == JOB_NAME:
            counts[f"{kind(tenant)} -> {queue}"] += int(value)
    return counts


def kind(tenant: str) -> str:
    return "small" if tenant.startswith("small-") else tenant


def listeners(conn: redis_py.Redis) -> int:
    counts = dict(conn.pubsub_numsub(keys.WAKE_CHANNEL))
    return int(counts.get(keys.WAKE_CHANNEL.encode(), 0))


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.005)


def enqueuer_for(conn: redis_py.Redis, mode: str) -> limitd.Enqueuer:
    """fair: the job with rules, through the default client chain (fair_tenant in it);
    fifo: the job without rules, through a client with no middleware at all."""
    if mode == "fair":
        return fair_work.set(client=limitd.Client(conn))
    return fifo_work.set(client=limitd.Client(conn, middleware=ClientChain()))


def push_small(enqueuer: limitd.Enqueuer, tenant: int, plan: SmallPlan, start: float) -> None:
    name = small_name(tenant)
    for seq, offset in plan.schedule(tenant):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        recorder.push_time(name, seq)
        enqueuer.perform_async(name, seq)
        recorder.return_time(name, seq)


def start_small_tenants(
    enqueuer: limitd.Enqueuer, plan: SmallPlan, start: float
) -> list[threading.Thread]:
    threads = [
        threading.Thread(target=push_small, args=(enqueuer, i, plan, start), daemon=True)
        for i in range(plan.tenants)
    ]
    for thread in threads:
        thread.start()
    return threads


def produce_and_wait(
    enqueuer: limitd.Enqueuer, load: Workload, timeout: float
) -> tuple[float, float]:
    """The burst and the small tenants' pushes, until every job ran. Returns the start of
    the burst (perf_counter) and the seconds it took to enqueue."""
    start = time.perf_counter()
    producers = start_small_tenants(enqueuer, load.plan, start)
    enqueuer.perform_bulk([[load.greedy, i] for i in range(load.greedy_jobs)])
    burst = time.perf_counter() - start
    for thread in producers:
        thread.join(load.plan.spread + timeout)
    recorder.wait(timeout)
    return start, burst


def run(conn: redis_py.Redis, mode: str, load: Workload) -> RunResult:
    """One run on a fresh capsule, idle and subscribed to wake-ups before the burst."""
    reset(conn, tenants(load.plan))
    recorder.begin(load.greedy_jobs + load.plan.total, load.work_seconds)
    enqueuer = enqueuer_for(conn, mode)
    before = listeners(conn)
    capsule = Capsule(capsule_config(load.threads), redis=conn)
    capsule.start()
    try:
        wait_until(lambda: listeners(conn) > before, "the capsule's wake-up subscription")
        timeout = 60 + 20 * (load.greedy_jobs + load.plan.total) * load.work_seconds
        start, burst = produce_and_wait(enqueuer, load, timeout)
    finally:
        capsule.stop(timeout=STOP_TIMEOUT)
    return summarize(mode, start, burst, reroutes(conn))


def summarize(mode: str, start: float, burst: float, rerouted: Counter[str]) -> RunResult:
    """The recorder's view of the run that just ended."""
    ran, pushed, returned = recorder.ran, recorder.pushed, recorder.returned
    small = [(pushed[(r.tenant, r.seq)], r.started) for r in ran if kind(r.tenant) == "small"]
    waits = [started - push for push, started in small]
    offsets = [push - start for push, _ in small]
    calls = [returned[key] - pushed[key] for key in pushed]
    drain = max(r.ended for r in ran if kind(r.tenant) != "small") - start
    pushes_end = max(pushed.values(), default=start) - start
    after = sum(1 for r in ran if start + burst < r.ended <= start + drain)
    rate = after / (drain - burst) if drain > burst else float("nan")
    queues: dict[str, Counter[str]] = {}
    for entry in ran:
        queues.setdefault(kind(entry.tenant), Counter())[entry.queue] += 1
    return RunResult(mode, waits, offsets, calls, drain, burst, pushes_end, rate, queues, rerouted)


def calibrate(conn: redis_py.Redis, threads: int, work_seconds: float) -> float:
    """Jobs/s of a FIFO drain of CALIBRATION_JOBS jobs, no small tenants."""
    load = Workload(threads, work_seconds, CALIBRATION, CALIBRATION_JOBS, SmallPlan(0, 0, 0.0))
    return CALIBRATION_JOBS / run(conn, "fifo", load).greedy_drain


def percentile_ms(values: list[float], percent: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1] * 1000


def queue_counts(counts: Counter[str]) -> str:
    return ", ".join(f"{queue} {n:,}" for queue, n in sorted(counts.items()))


def print_header(args: argparse.Namespace, plan: SmallPlan) -> None:
    weights = ", ".join(f"{name}:{weight}" for name, weight in QUEUES)
    rules = "; ".join(f"over {r['threshold']} jobs in {r['per']} s -> {r['queue']}" for r in RULES)
    print(
        f"greedy tenant: {args.greedy_jobs:,} jobs in one perform_bulk; small tenants: "
        f"{plan.tenants} x {plan.jobs} jobs, pushed evenly over {plan.spread:.2f} s\n"
        f"work: sleep {args.work_ms:g} ms per job; capsule: limit fetch, {args.threads} "
        f"threads, queues {weights}\n"
        f"rounds: {args.rounds} (a fifo and a fair run each, order alternated)\n"
        f"fair rules (per tenant, last match wins): {rules}\n"
        "wait = from just before the small tenant's push to the first line of its job "
        "(the push call included)",
        flush=True,
    )
    print(
        f"{'run':<8} {'small p50':>10} {'small p99':>10} {'small max':>10} {'push p50':>9} "
        f"{'greedy drain':>13} {'burst':>7} {'jobs/s after':>13} {'pushes end':>11}\n"
        f"{'':<8} {'wait (ms)':>10} {'wait (ms)':>10} {'wait (ms)':>10} {'(ms)':>9} "
        f"{'(s)':>13} {'(s)':>7} {'the burst':>13} {'(% drain)':>11}",
        flush=True,
    )


def print_row(label: str, runs: list[RunResult]) -> None:
    """One run, or several pooled: waits and push calls pooled, times as medians."""
    waits = [w for r in runs for w in r.small_waits]
    calls = [c for r in runs for c in r.push_calls]
    drain = statistics.median(r.greedy_drain for r in runs)
    burst = statistics.median(r.burst for r in runs)
    span = statistics.median(r.pushes_end / r.greedy_drain for r in runs)
    rate = statistics.median(r.rate_after_burst for r in runs)
    print(
        f"{label:<8} {percentile_ms(waits, 50):>10.1f} {percentile_ms(waits, 99):>10.1f} "
        f"{max(waits) * 1000:>10.1f} {statistics.median(calls) * 1000:>9.1f} "
        f"{drain:>13.2f} {burst:>7.2f} {rate:>13,.0f} {span:>11.0%}",
        flush=True,
    )


def print_verdict(results: dict[str, list[RunResult]]) -> None:
    fifo, fair = results["fifo"], results["fair"]
    for mode in MODES:
        print_row(f"{mode} all", results[mode])
    waits = {mode: [w for r in runs for w in r.small_waits] for mode, runs in results.items()}
    ratio = percentile_ms(waits["fifo"], 99) / percentile_ms(waits["fair"], 99)
    paired = [b.greedy_drain / a.greedy_drain for a, b in zip(fifo, fair, strict=True)]
    of_medians = statistics.median(r.greedy_drain for r in fair) / statistics.median(
        r.greedy_drain for r in fifo
    )
    print("(all: waits pooled over the rounds; the other columns: medians)")
    print(f"small tenants' p99: fifo/fair = {ratio:,.0f}x (target >= 10x)")
    print(
        f"greedy drain: fair/fifo = {statistics.median(paired):.3f} (target within 10%: "
        f"0.90-1.10); the median of the rounds' ratios "
        f"{', '.join(f'{x:.3f}' for x in paired)}; ratio of the medians {of_medians:.3f}"
    )
    print_burst_split(fair)
    for mode in MODES:
        print_routes(mode, results[mode])


def print_burst_split(runs: list[RunResult]) -> None:
    """Small tenants' waits for pushes made while the greedy burst was being enqueued,
    and after: where the fair run's tail comes from."""
    during: list[float] = []
    after: list[float] = []
    for r in runs:
        for wait, pushed in zip(r.small_waits, r.small_pushed, strict=True):
            (during if pushed < r.burst else after).append(wait)
    for label, waits in (("during the burst's enqueue", during), ("after it", after)):
        if len(waits) >= 2:
            print(
                f"  fair, small pushes {label}: {len(waits)}, wait p50 "
                f"{percentile_ms(waits, 50):.1f} ms, p99 {percentile_ms(waits, 99):.1f} ms, "
                f"max {max(waits) * 1000:.1f} ms"
            )


def print_routes(mode: str, runs: list[RunResult]) -> None:
    """Which queues the jobs ran from (one line when every run agrees)."""
    lines = []
    for r in runs:
        ran = "; ".join(f"{k} from {queue_counts(c)}" for k, c in sorted(r.queues.items()))
        lines.append(f"{ran}; middleware reroutes: {queue_counts(r.reroutes) or 'none'}")
    if len(set(lines)) == 1:
        print(f"{mode}, each run: {lines[0]}")
        return
    for number, line in enumerate(lines, 1):
        print(f"{mode} {number}: {line}")


def run_rounds(conn: redis_py.Redis, load: Workload, rounds: int) -> dict[str, list[RunResult]]:
    """fifo, fair, fair, fifo, ...: both modes see the same drift of a noisy machine."""
    results: dict[str, list[RunResult]] = {mode: [] for mode in MODES}
    for number in range(1, rounds + 1):
        for mode in MODES if number % 2 else MODES[::-1]:
            result = run(conn, mode, load)
            results[mode].append(result)
            print_row(f"{mode} {number}", [result])
    return results


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--greedy-jobs", type=int, default=20_000)
    parser.add_argument("--small-tenants", type=int, default=10)
    parser.add_argument("--small-jobs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--spread",
        type=float,
        help="seconds over which small tenants push (default: 70%% of the FIFO drain "
        "of the greedy burst, estimated from a calibration drain)",
    )
    parser.add_argument("--redis", help="Redis URL (default: a private redis-server)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    work_seconds = args.work_ms / 1000
    with redis_for_bench(args.redis) as conn:
        spread = args.spread
        if spread is None:
            rate = calibrate(conn, args.threads, work_seconds)
            spread = SPREAD_SHARE * args.greedy_jobs / rate
            print(
                f"calibration: {CALIBRATION_JOBS:,} jobs drained FIFO at {rate:,.0f} jobs/s: "
                f"estimated FIFO drain {args.greedy_jobs / rate:.2f} s"
            )
        plan = SmallPlan(args.small_tenants, args.small_jobs, spread)
        print_header(args, plan)
        load = Workload(args.threads, work_seconds, GREEDY, args.greedy_jobs, plan)
        results = run_rounds(conn, load, args.rounds)
    print_verdict(results)


if __name__ == "__main__":
    main()
