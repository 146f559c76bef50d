"""Figures of a run: per-system summaries, the markdown of RESULTS.md and the data for
the chart. Medians with min-max, because the machine is noisy."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from systems.base import System


@dataclass
class Outcome:
    """Everything measured for one system across its runs."""

    system: System
    jobs: int  # per run
    enqueue: list[float] = field(default_factory=list)  # jobs/s per run
    drain: list[float] = field(default_factory=list)  # whole drain, jobs/s per run
    first_job: list[float] = field(default_factory=list)  # seconds per run
    commands_whole: list[float] = field(default_factory=list)  # whole drain, per job
    # The steady window (10% to 90% of the jobs), per run:
    steady: list[float] = field(default_factory=list)  # jobs/s
    commands: list[float] = field(default_factory=list)  # Redis commands per job
    lua: list[float] = field(default_factory=list)  # Lua calls per job
    redis_cpu: list[float] = field(default_factory=list)  # redis-server CPU us per job
    worker_cpu: list[float] = field(default_factory=list)  # the workers' CPU us per job
    rounds: list[int] = field(default_factory=list)  # the run number of each steady figure
    error: str | None = None

    def steady_by_round(self) -> dict[int, tuple[float, float]]:
        """Steady drain (jobs/s) and worker CPU (us/job) by run number."""
        return dict(zip(self.rounds, zip(self.steady, self.worker_cpu, strict=True), strict=True))


@dataclass(frozen=True)
class Baseline:
    """What the machine allows, measured in the same run as the systems."""

    ceiling: dict[str, float]  # EVALSHA calls/s by way of calling
    incr_us: dict[str, float]  # one INCR round trip, us, by client


METHOD = """\
How it is measured:

- Each job increments a Redis counter (`INCR bench:done`: one more round trip per job,
  in every system).
- Enqueue: N jobs pushed by the system's own client in a fresh process, timed around the
  enqueue calls only (imports excluded), with the bulk API where the system has one a
  user would use (the "enqueue API" column).
- Drain: the worker processes are started after the enqueue and the counter is read
  every 10 ms until it reads N; the workers' process groups are then stopped and the
  counter must be exactly N. The whole drain runs from starting the workers until the
  counter reads N, so worker start-up is inside it ("first job after" is how much of it
  that is). The steady drain is the window between the counter first reading 10% and
  first reading 90% of N (jobs done in it / its seconds): start-up and the tail left
  out. The figures marked "steady" are taken over that window.
- Worker CPU per job: user + sys CPU of every process of the workers' sessions (each
  worker command is a session leader; capsules, prefork children and processes that
  already exited included), read from /proc/<pid>/stat at both ends of the window,
  divided by the jobs done in it. It is CPU the system's own processes spent per job,
  whatever the number of processes or threads.
- Redis commands per job: INFO commandstats over the window (commands run inside Lua
  scripts included, the driver's own reads excluded; the whole-drain figure also holds
  start-up and heartbeats); in brackets the EVAL/EVALSHA calls per job.
  redis-server CPU per job: INFO cpu (user + sys) over the window, divided by the jobs
  done in it; Redis shares the 2 cores with the workers.
- "steady / Lua ceiling" divides the median steady drain by the 1-client pipelined
  ceiling below.
- limitd and the floor worker run from the project venv, the peers from
  bench/peers/.venv, whose redis-py is older and uses hiredis (arq needs redis-py < 6).
  The job's own INCR goes through each system's client: for limitd,
  `limitd.redis_client()` (its counterpart of `Sidekiq.redis`, which the Ruby job uses:
  redis-py over one connection per thread); for `limitd-plain` and the Python peers, a
  plain `redis.Redis`. The cost of one round trip through each is timed below.
- The floor rows are not a job system: threads that BRPOP limitd's queue list,
  json.loads the payload and call the function its class names (no acknowledgement, no
  retries), on the same payloads as limitd (enqueued by limitd). They show what one
  Python process can reach on this machine with the client limitd's job uses."""

CEILING_LABELS = {
    "pipelined_1_client": "1 client, pipelines of 100",
    "pipelined_2_clients": "2 client processes, pipelines of 100",
    "round_trip_1_client": "1 client, one round trip per call",
}

COLUMNS = (
    "system",
    "steady drain jobs/s, median (min-max)",
    "whole drain jobs/s, median",
    "worker CPU per job, steady (us)",
    "redis-server CPU per job, steady (us)",
    "Redis commands per job, steady (Lua calls)",
    "Redis commands per job, whole drain",
    "first job after (s)",
    "enqueue jobs/s, median (min-max)",
    "steady / Lua ceiling",
    "jobs per run",
    "settings",
    "enqueue API",
)


def spread(values: list[float]) -> str:
    """``median (min-max)`` in whole numbers, or a dash when nothing was measured."""
    if not values:
        return "-"
    low, high = min(values), max(values)
    return f"{statistics.median(values):,.0f} ({low:,.0f}-{high:,.0f})"


def _median(values: list[float], fmt: str) -> str:
    return format(statistics.median(values), fmt) if values else "-"


def _row(outcome: Outcome, ceiling: float | None) -> str:
    share = "-"
    if outcome.steady and ceiling:
        share = f"{100 * statistics.median(outcome.steady) / ceiling:.1f}%"
    note = f" **error:** {outcome.error}" if outcome.error else ""
    cells = [
        f"`{outcome.system.name}`",
        spread(outcome.steady),
        _median(outcome.drain, ",.0f"),
        _median(outcome.worker_cpu, ".0f"),
        _median(outcome.redis_cpu, ".0f"),
        f"{_median(outcome.commands, '.1f')} ({_median(outcome.lua, '.2f')})",
        _median(outcome.commands_whole, ".1f"),
        _median(outcome.first_job, ".2f"),
        spread(outcome.enqueue),
        share,
        f"{outcome.jobs:,}",
        outcome.system.settings + note,
        outcome.system.enqueue_api,
    ]
    return "| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |"


def results_table(outcomes: list[Outcome], ceiling: float | None) -> str:
    """The main table: one row per system, in run order."""
    header = "| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|"
    return "\n".join([header, *(_row(o, ceiling) for o in outcomes)])


def _ratios(this: Outcome, other: Outcome, index: int) -> list[float]:
    """this / other of a figure of ``steady_by_round`` (0: the steady drain, 1: the
    worker CPU per job), by round: the rounds both measured, the other's figure found."""
    mine, theirs = this.steady_by_round(), other.steady_by_round()
    rounds = sorted(mine.keys() & theirs.keys())
    return [mine[n][index] / theirs[n][index] for n in rounds if theirs[n][index] > 0]


def _by_round(ratios: list[float]) -> str:
    by_round = ", ".join(f"{ratio:.2f}" for ratio in ratios)
    return f"by round ({len(ratios)}) {by_round}; median {statistics.median(ratios):.2f}"


def compare_lines(pairs: list[tuple[Outcome, Outcome]]) -> list[str]:
    """For each system and its --compare twin: this / other of the steady drain and of
    the worker CPU per job, by round (the rounds both measured) and their median."""
    lines = []
    for this, other in pairs:
        label = f"{this.system.name} / {other.system.name}"
        if not this.steady_by_round().keys() & other.steady_by_round().keys():
            lines.append(f"{label}: no round with a steady figure from both")
            continue
        for index, what in enumerate(("steady drain", "worker CPU per job")):
            ratios = _ratios(this, other, index)
            if not ratios:  # a twin whose processes the CPU reading did not find
                lines.append(f"{label}, {what}: no figure from the other")
                continue
            lines.append(f"{label}, {what} this / other, {_by_round(ratios)}")
    return lines


# Ruby Sidekiq's figures on a quiet machine (steal 0%), from the slower of the two
# quiet machines of 2026-11-24 (issue 33): steady drain jobs/s and worker CPU us per
# job. A run in which Sidekiq drains less than that while spending more CPU per job
# than 1.5 times that is far off its quiet figures: the machine, not the code, slowed
# it, and no ratio against it is printed from that run.
SIDEKIQ_QUIET = {1: (6_722.0, 132.0), 2: (10_827.0, 153.0)}
FAR_OFF_CPU = 1.5


def peer_lines(outcomes: list[Outcome]) -> list[str]:
    """For each Ruby Sidekiq of N processes measured beside limitd's N: how it ran
    against its quiet figures, and the ratio of the steady drains by round only where
    it ran near them (limitd-N / sidekiq-N, the rounds both measured)."""
    by_name = {o.system.name: o for o in outcomes}
    lines = []
    for processes, (quiet_rate, quiet_cpu) in SIDEKIQ_QUIET.items():
        peer, ours = by_name.get(f"sidekiq-{processes}"), by_name.get(f"limitd-{processes}")
        if peer is None or ours is None or not peer.steady or not ours.steady:
            continue
        rate, cpu = statistics.median(peer.steady), statistics.median(peer.worker_cpu)
        state = (
            f"sidekiq-{processes} ran {rate:,.0f} jobs/s at {cpu:.0f} us of worker CPU per "
            f"job, {rate / quiet_rate:.2f}x and {cpu / quiet_cpu:.2f}x its quiet figures "
            f"({quiet_rate:,.0f} jobs/s, {quiet_cpu:.0f} us)"
        )
        if rate < quiet_rate and cpu > FAR_OFF_CPU * quiet_cpu:
            lines.append(f"{state}: far off them, so no ratio against it from this run")
            continue
        ratios = _ratios(ours, peer, 0)
        if not ratios:
            lines.append(f"{state}; no round in which limitd-{processes} ran too")
            continue
        pair = f"limitd-{processes} / sidekiq-{processes}"
        lines.append(f"{state}; {pair}, steady drain {_by_round(ratios)}")
    return lines


def baseline_section(baseline: Baseline) -> list[str]:
    ceiling = [
        f"| {CEILING_LABELS[key]} | {value:,.0f} |" for key, value in baseline.ceiling.items()
    ]
    incr = [f"| {client} | {us:.0f} |" for client, us in baseline.incr_us.items()]
    return [
        "## Ceiling: Lua fetch-like calls per second on this Redis",
        "",
        "A tiny script (`RPOP` a job, `INCR` a counter) called with EVALSHA from the peers' "
        "venv (the faster client). A system spending one Lua call per job cannot drain "
        "faster than this; the round-trip figure is the limit of one connection that waits "
        "for each reply.",
        "",
        "| EVALSHA of RPOP+INCR | calls/s |",
        "|---|---|",
        *ceiling,
        "",
        "One `INCR` round trip from one thread, by client (the job's own work here):",
        "",
        "| client | us per call |",
        "|---|---|",
        *incr,
        "",
    ]


def markdown(
    lines: list[str],
    outcomes: list[Outcome],
    baseline: Baseline,
    skipped: list[str],
    compared: list[str] | None = None,
    *,
    peers: list[str] | None = None,
) -> str:
    """The whole of RESULTS.md; ``compared`` are run.py --compare's ratio lines, ``peers``
    the lines of ``peer_lines``."""
    text = [
        "# limitd and its peers: enqueue and drain throughput, CPU per job",
        "",
        "Produced by `.venv/bin/python bench/peers/run.py` (from the repository root) on a "
        "noisy 2-core machine: read differences under ~10-15% as noise.",
        "",
        *lines,
        "",
        METHOD,
        "",
        "## Results",
        "",
        results_table(outcomes, baseline.ceiling.get("pipelined_1_client")),
        "",
        *(f"{line}  " for line in skipped),
        "",
        *([f"- {line}" for line in peers] + [""] if peers else []),
        *(
            ["With --compare, this / other per round (other: the `@other` rows):", ""]
            + [f"- {line}" for line in compared]
            + [""]
            if compared
            else []
        ),
        "![steady drain jobs/s per system](drain.png)",
        "",
        *baseline_section(baseline),
    ]
    return "\n".join(text)


def chart_data(outcomes: list[Outcome], title: str) -> dict[str, object]:
    """The steady drain per system, for chart.py."""
    rows = [
        {
            "name": o.system.name,
            "median": statistics.median(o.steady),
            "min": min(o.steady),
            "max": max(o.steady),
        }
        for o in outcomes
        if o.steady
    ]
    return {"title": title, "systems": rows}
