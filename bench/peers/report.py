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
    drain: list[float] = field(default_factory=list)  # jobs/s per run
    first_job: list[float] = field(default_factory=list)  # seconds per run
    commands: list[float] = field(default_factory=list)  # Redis commands per job, per run
    lua: list[float] = field(default_factory=list)  # Lua calls per job, per run
    redis_cpu: list[float] = field(default_factory=list)  # server CPU us per job, per run
    error: str | None = None


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
- Drain: the worker processes are started after the enqueue and timed until the counter
  reads N (sampled every 10 ms), so worker start-up is inside the figure ("first job
  after" is how much of it that is). The workers' process groups are then stopped and
  the counter must be exactly N.
- Redis commands per job: INFO commandstats over the drain (commands run inside Lua
  scripts included, the driver's own reads excluded, start-up and heartbeats included);
  in brackets the EVAL/EVALSHA calls per job. redis-server CPU per job: INFO cpu (user
  + sys) over the drain, divided by N; Redis shares the 2 cores with the workers.
- "drain / Lua ceiling" divides the median drain by the 1-client pipelined ceiling below.
- limitd runs from the project venv, the peers from bench/peers/.venv, whose redis-py is
  older and uses hiredis (arq needs redis-py < 6). The job's own INCR goes through each
  venv's client; the cost of one round trip through each is timed below."""

CEILING_LABELS = {
    "pipelined_1_client": "1 client, pipelines of 100",
    "pipelined_2_clients": "2 client processes, pipelines of 100",
    "round_trip_1_client": "1 client, one round trip per call",
}

COLUMNS = (
    "system",
    "drain jobs/s, median (min-max)",
    "enqueue jobs/s, median (min-max)",
    "first job after (s)",
    "Redis commands per job (Lua calls)",
    "redis-server CPU per job (us)",
    "drain / Lua ceiling",
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
    if outcome.drain and ceiling:
        share = f"{100 * statistics.median(outcome.drain) / ceiling:.1f}%"
    note = f" **error:** {outcome.error}" if outcome.error else ""
    cells = [
        f"`{outcome.system.name}`",
        spread(outcome.drain),
        spread(outcome.enqueue),
        _median(outcome.first_job, ".2f"),
        f"{_median(outcome.commands, '.1f')} ({_median(outcome.lua, '.2f')})",
        _median(outcome.redis_cpu, ".0f"),
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
    lines: list[str], outcomes: list[Outcome], baseline: Baseline, skipped: list[str]
) -> str:
    """The whole of RESULTS.md."""
    text = [
        "# limitd and its peers: enqueue and drain throughput",
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
        "![drain jobs/s per system](drain.png)",
        "",
        *baseline_section(baseline),
    ]
    return "\n".join(text)


def chart_data(outcomes: list[Outcome], title: str) -> dict[str, object]:
    rows = [
        {
            "name": o.system.name,
            "median": statistics.median(o.drain),
            "min": min(o.drain),
            "max": max(o.drain),
        }
        for o in outcomes
        if o.drain
    ]
    return {"title": title, "systems": rows}
