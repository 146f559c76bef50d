"""``limitd start CONFIG`` as operators run it: a subprocess, real signals, YAML files,
the embedded Redis. Process titles and the process tree are read from /proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis as redis_py

from limitd import keys
from limitd.api import Processes
from limitd.connection.embedded import RedisServer
from limitd.supervisor import cpu_affinity
from limitd.supervisor.titles import capsule_title
from tests.helpers import children, limitd_start, running, wait_for

APP = textwrap.dedent("""
    import threading, limitd

    @limitd.job(name="supervisor_app.Hold", queue="work")
    def hold(seconds):
        threading.Event().wait(seconds)
""")

TWO_CAPSULES = textwrap.dedent("""
    require: [supervisor_app]
    tag: tree
    timeout: 1
    heartbeat_period: 0.5
    queues: [work]
    concurrency: 3
    capsules:
      side:
        queues: [side]
        concurrency: 2
        processes: 2
""")


def title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "supervisor_app.py").write_text(APP)
    (tmp_path / "two.yml").write_text(TWO_CAPSULES)
    return tmp_path


def test_two_capsules_make_the_expected_process_tree(
    supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    proc = supervisor("two.yml")
    wait_for(lambda: len(children(proc.pid)) == 3, message="three capsule processes")
    pids = children(proc.pid)
    wait_for(
        lambda: title(proc.pid) == "limitd supervisor tree [3 children]", message="supervisor title"
    )
    expected = [
        "limitd capsule default tree [0 of 3 busy] queues: work",
        "limitd capsule side tree [0 of 2 busy] queues: side",
        "limitd capsule side tree [0 of 2 busy] queues: side",
    ]
    # The supervisor registers a child before the child has set its own title.
    wait_for(lambda: sorted(title(pid) for pid in pids) == expected, message="child titles")
    redis.lpush(
        keys.of(redis).queue("work"),
        json.dumps({"class": "supervisor_app.Hold", "args": [5], "jid": "a" * 24}),
    )
    worker = next(pid for pid in pids if "default" in title(pid))
    wait_for(lambda: "[1 of 3 busy]" in title(worker), message="title follows the work")


def wait_for_titles(supervisor_pid: int, count: int) -> None:
    """Until the supervisor has ``count`` children, each with its capsule title: a
    capsule sets it once its scheduling policy and CPUs are set."""

    def titled() -> bool:
        pids = children(supervisor_pid)
        return len(pids) == count and all("limitd capsule" in title(pid) for pid in pids)

    wait_for(titled, timeout=30, message=f"{count} capsule processes with their titles")


def thread_files(pid: int, name: str) -> list[str]:
    """The file ``name`` of every thread of ``pid`` (a short-lived thread that ends while
    they are read has none). Read from the process's own task directory, not by thread
    id: with pid_max at 32,768 a busy suite wraps thread ids, and the id of a thread that
    just ended can name a thread of another process by the time it is asked."""
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found.append(Path(f"/proc/{pid}/task/{tid}/{name}").read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def policies(pid: int) -> set[int]:
    """The kernel scheduling policy of every thread of ``pid`` (``stat``, field 41)."""
    return {int(stat[stat.rindex(")") + 2 :].split()[38]) for stat in thread_files(pid, "stat")}


def test_capsule_processes_run_under_the_configured_cpu_scheduling(
    app_dir: Path, supervisor: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """Every thread of a capsule process runs under SCHED_BATCH by default (they are
    started after the policy is set, and inherit it); a capsule set to ``normal`` runs
    under the kernel's default, and the supervisor keeps the policy it was started with.
    Each capsule sets its title once its policy is set, so the policies are read once
    all three have one."""
    (app_dir / "mixed.yml").write_text(
        TWO_CAPSULES.replace("    processes: 2\n", "    processes: 2\n    cpu_scheduling: normal\n")
    )
    proc = supervisor("mixed.yml")
    wait_for_titles(proc.pid, 3)
    pids = children(proc.pid)
    by_capsule: dict[str, set[int]] = {"default": set(), "side": set()}
    for pid in pids:
        by_capsule["side" if "capsule side" in title(pid) else "default"] |= policies(pid)
    threads = {pid: (title(pid), sorted(os.listdir(f"/proc/{pid}/task"))) for pid in pids}
    assert by_capsule == {"default": {os.SCHED_BATCH}, "side": {os.SCHED_OTHER}}, threads
    # The supervisor is left with the policy it was started with: its starter's, this
    # test's thread's (a test that ran run_capsule in this process once left it under
    # SCHED_BATCH, and every process started after inherited it).
    started_with = os.sched_getscheduler(0)
    assert policies(proc.pid) == {started_with}, (started_with, policies(os.getpid()))


def cpu_sets(pid: int) -> set[frozenset[int]]:
    """The CPUs each thread of ``pid`` may run on (``Cpus_allowed_list``)."""
    return {
        frozenset(cpu_list(status.split("Cpus_allowed_list:", 1)[1].split()[0]))
        for status in thread_files(pid, "status")
    }


def cpu_list(text: str) -> set[int]:
    """``0-2,5`` as {0, 1, 2, 5}."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def test_capsule_processes_keep_their_threads_on_the_cpus_cpu_affinity_gives(
    app_dir: Path, supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    """``cpu_affinity: 1`` on a capsule of two processes: each keeps every thread on one
    CPU of the supervisor's set (children 1 and 2, so two different CPUs when there are
    two or more), while the capsule with ``none`` and the supervisor keep the whole set.
    Each process record says where its process may run (``limitd status``)."""
    (app_dir / "pinned.yml").write_text(
        TWO_CAPSULES.replace("    processes: 2\n", "    processes: 2\n    cpu_affinity: 1\n")
        + "cpu_affinity: none\n"
    )
    proc = supervisor("pinned.yml")
    wait_for_titles(proc.pid, 3)
    allowed = frozenset(os.sched_getaffinity(0))
    side = [pid for pid in children(proc.pid) if "capsule side" in title(pid)]
    default = [pid for pid in children(proc.pid) if "capsule side" not in title(pid)]
    pinned = [cpu_sets(pid) for pid in side]
    assert all(len(sets) == 1 and len(next(iter(sets))) == 1 for sets in pinned), pinned
    on = {next(iter(sets)) for sets in pinned}
    assert all(cpus <= allowed for cpus in on)
    assert len(on) == min(2, len(allowed)), on
    assert [cpu_sets(pid) for pid in default] == [{allowed}]
    assert cpu_sets(proc.pid) == {allowed}
    wait_for(lambda: len(Processes(redis)) == 3, message="three process records")
    recorded = {process.pid: process.cpus for process in Processes(redis)}
    expected = {pid: cpu_affinity.listed(next(iter(cpu_sets(pid)))) for pid in side + default}
    assert recorded == expected


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to choose")
def test_auto_keeps_a_lone_capsule_process_on_one_cpu(
    app_dir: Path, supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    """The default, ``cpu_affinity: auto``: a lone capsule process keeps every thread on
    one CPU of the supervisor's set, and its process record says which. (What makes it
    move or let go is read from /proc: tests/test_cpu_affinity.py.)"""
    (app_dir / "auto.yml").write_text(
        "require: [supervisor_app]\nqueues: [work]\nconcurrency: 2\nheartbeat_period: 0.5\n"
    )
    proc = supervisor("auto.yml")
    wait_for_titles(proc.pid, 1)
    [capsule] = children(proc.pid)
    [on] = cpu_sets(capsule)
    assert len(on) == 1 and on <= os.sched_getaffinity(0), on
    assert cpu_sets(proc.pid) == {frozenset(os.sched_getaffinity(0))}
    wait_for(lambda: len(Processes(redis)) == 1, message="the process record")
    assert [process.cpus for process in Processes(redis)] == [cpu_affinity.listed(on)]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to choose")
def test_two_supervisors_started_together_give_their_capsules_different_cpus(
    app_dir: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Both read the CPUs idle at the same moment, and each would count from its own
    first CPU: the claims they share (``$LIMITD_CPU_CLAIMS``, here a file of the test's
    own) keep them apart, so neither gets half a CPU while the other CPU idles."""
    (app_dir / "auto.yml").write_text(
        "require: [supervisor_app]\nqueues: [work]\nconcurrency: 2\nheartbeat_period: 0.5\n"
    )
    env = {
        **os.environ,
        "LIMITD_REDIS_URL": redis_server.url,
        "LIMITD_CPU_CLAIMS": str(tmp_path / "cpus"),
    }
    procs = [limitd_start(app_dir, "auto.yml", env=env) for _ in range(2)]
    try:
        for proc in procs:
            wait_for_titles(proc.pid, 1)
        # What each chose at start (a watch may move or release it later, on a busy
        # machine): one line per capsule process, in the log both supervisors share.
        wait_for(lambda: len(chosen_cpus(app_dir)) == 2, message="both choices logged")
        assert len(set(chosen_cpus(app_dir))) == 2, chosen_cpus(app_dir)
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def chosen_cpus(app_dir: Path) -> list[int]:
    """The CPU each capsule process took under ``auto``, from the INFO line it logs."""
    marker = "keeps its threads on CPU "
    return [
        int(line.split(marker, 1)[1].split()[0])
        for line in (app_dir / "limitd.log").read_text().splitlines()
        if marker in line
    ]


def test_term_requeues_a_long_job_and_leaves_no_child(
    supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    proc = supervisor("two.yml")
    wait_for(lambda: redis.scard(keys.of(redis).CAPSULES) == 3, message="three capsule processes")
    pids = children(proc.pid)
    redis.lpush(
        keys.of(redis).queue("work"),
        json.dumps({"class": "supervisor_app.Hold", "args": [60], "jid": "b" * 24}),
    )
    wait_for(lambda: int(redis.hget(keys.of(redis).BUSY, "work") or 0) == 1, message="job running")
    stopped_at = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=1 + 5) == 0  # timeout: 1 in two.yml, plus 5 s
    assert time.monotonic() - stopped_at < 1 + 5
    [job] = redis.lrange(keys.of(redis).queue("work"), 0, -1)
    assert json.loads(job)["jid"] == "b" * 24
    assert not any(running(pid) for pid in pids)
    assert redis.scard(keys.of(redis).CAPSULES) == 0
    assert int(redis.hget(keys.of(redis).BUSY, "work") or 0) == 0


def test_tstp_quiets_every_child_and_ttin_dumps_stacks(
    supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis, app_dir: Path
) -> None:
    proc = supervisor("two.yml")
    wait_for(lambda: redis.scard(keys.of(redis).PROCESSES) == 3, message="three process records")
    identities = list(redis.smembers(keys.of(redis).PROCESSES))
    proc.send_signal(signal.SIGTSTP)
    wait_for(
        lambda: all(redis.hget(i, "quiet") == b"true" for i in identities),
        message="every child quiet",
    )
    redis.lpush(
        keys.of(redis).queue("work"), json.dumps({"class": "supervisor_app.Hold", "args": [0]})
    )
    beats = {i: redis.hget(i, "beat") for i in identities}
    # Each child beats every 0.5 s; two beats each is ample time for a fetch to happen.
    wait_for(
        lambda: all(redis.hget(i, "beat") != beats[i] for i in identities),
        message="a beat of every child",
    )
    beats = {i: redis.hget(i, "beat") for i in identities}
    wait_for(
        lambda: all(redis.hget(i, "beat") != beats[i] for i in identities),
        message="a second beat of every child",
    )
    assert redis.llen(keys.of(redis).queue("work")) == 1, "a quiet child fetched a job"
    proc.send_signal(signal.SIGTTIN)
    log = app_dir / "limitd.log"
    wait_for(
        lambda: log.read_text().count("thread limitd-heartbeat") >= 3,
        message="stacks from every child",
    )


@pytest.mark.parametrize(
    ("config", "key", "expected"),
    [
        ("queues: [work]\nconcurency: 3\n", "concurency", "unknown key"),
        ("queues: [work]\nconcurrency: many\n", "concurrency", "integer"),
        ("queues: [work]\nconcurrency: -2\n", "concurrency", ">= 1"),
        ("queues: [work]\nlimits: {other: 2}\n", "limits.other", "not in this capsule"),
        ("queues: [work]\ncpu_scheduling: fast\n", "cpu_scheduling", "['batch', 'normal']"),
        ("queues: [work]\ncpu_affinity: 0\n", "cpu_affinity", "none or an integer >= 1"),
        ("queues: [work]\ncpu_affinity: all\n", "cpu_affinity", "none or an integer >= 1"),
        (
            "capsules:\n  mail:\n    queues: [mail]\n    processes: 0\n",
            "capsules.mail.processes",
            ">= 1",
        ),
    ],
)
def test_bad_config_exits_78_naming_file_and_key(
    app_dir: Path, config: str, key: str, expected: str
) -> None:
    (app_dir / "bad.yml").write_text("require: [supervisor_app]\n" + config)
    for command in ("start", "check"):
        out = subprocess.run(
            [sys.executable, "-m", "limitd.cli", command, "bad.yml"],
            cwd=app_dir,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert out.returncode == 78, out.stderr
        assert f"bad.yml: {key}: " in out.stderr
        assert expected in out.stderr


def test_check_prints_the_merged_config(app_dir: Path) -> None:
    (app_dir / "prod.yml").write_text("concurrency: 7\ncapsules:\n  side:\n    processes: 3\n")
    out = subprocess.run(
        [sys.executable, "-m", "limitd.cli", "check", "two.yml", "prod.yml"],
        cwd=app_dir,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert "concurrency: 7" in out.stdout
    assert "processes: 3" in out.stdout


def test_embedded_redis_persists_across_restarts_and_stops(app_dir: Path) -> None:
    (app_dir / "conf").mkdir()
    (app_dir / "conf" / "app.yml").write_text("require: [supervisor_app]\nqueues: [work]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LIMITD_REDIS_URL", "REDIS_URL")}
    url_file = app_dir / "conf" / ".limitd" / "redis.url"

    def run_once(action: Callable[[redis_py.Redis], None]) -> None:
        proc = limitd_start(app_dir, "conf/app.yml", env=env)
        try:
            wait_for(url_file.exists, timeout=20, message="the embedded Redis")
            with redis_py.Redis.from_url(url_file.read_text().strip()) as conn:
                wait_for(lambda: conn.scard(keys.of(conn).CAPSULES) == 1, message="a capsule")
                action(conn)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        assert not url_file.exists()
        assert not (app_dir / "conf" / ".limitd" / "redis.sock").exists()

    run_once(lambda conn: conn.zadd(keys.of(conn).SCHEDULE, {'{"class":"X","args":[]}': 4e9}))
    run_once(assert_kept)


def assert_kept(conn: redis_py.Redis) -> None:
    assert conn.zcard(keys.of(conn).SCHEDULE) == 1, "data written before the restart is still there"


GREEDY_APP = textwrap.dedent("""
    import limitd

    hoard = []

    @limitd.job(name="greedy_app.Grow", queue="work")
    def grow(megabytes):
        hoard.append(bytearray(megabytes * 1024 * 1024))
""")


def test_a_child_above_max_memory_is_recycled(
    app_dir: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    """It once failed under load: ``children`` counted the ``file`` process that
    importing croniter runs while the supervisor starts, and the TERM sent at the end
    reached a supervisor still loading, whose default action then ended it (-15)."""
    (app_dir / "greedy_app.py").write_text(GREEDY_APP)
    (app_dir / "greedy.yml").write_text(
        "require: [greedy_app]\nqueues: [work]\nheartbeat_period: 0.2\nmax_memory_mb: 150\n"
    )
    env = {**os.environ, "LIMITD_REDIS_URL": redis_server.url}
    proc = limitd_start(app_dir, "greedy.yml", env=env)
    try:
        wait_for(lambda: len(Processes(redis)) == 1, timeout=30, message="the capsule's record")
        first = Processes(redis).processes[0].pid
        assert children(proc.pid) == [first]
        redis.lpush(
            keys.of(redis).queue("work"), json.dumps({"class": "greedy_app.Grow", "args": [200]})
        )
        wait_for(
            lambda: "recycling it" in (app_dir / "limitd.log").read_text(),
            timeout=30,
            message="the greedy child recycled",
        )
        wait_for(
            lambda: [p.pid for p in Processes(redis)] not in ([], [first]),
            timeout=30,
            message="a fresh child in place of the greedy one",
        )
        assert not running(first)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_hup_reopens_the_log_file(
    app_dir: Path, redis_server: RedisServer, redis: redis_py.Redis
) -> None:
    (app_dir / "logged.yml").write_text(
        "require: [supervisor_app]\nqueues: [work]\nlogging: {file: worker.log}\n"
    )
    env = {**os.environ, "LIMITD_REDIS_URL": redis_server.url}
    proc = limitd_start(app_dir, "logged.yml", env=env)
    log, rotated = app_dir / "worker.log", app_dir / "worker.log.1"
    try:
        wait_for(lambda: log.exists() and "started" in log.read_text(), message="a log file")
        log.rename(rotated)  # what logrotate does
        proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: log.exists() and "log files reopened" in log.read_text(),
            message="a fresh log file",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    assert "supervisor stopped" in log.read_text()


def test_term_right_after_a_fork_still_stops_the_child(
    supervisor: Callable[..., subprocess.Popen[bytes]], app_dir: Path
) -> None:
    """A TERM relayed while a child is still starting must wait for the child's own
    handlers (signals stay blocked across the fork), not vanish into the copy of the
    supervisor's handlers the child inherited, which left it running until killed."""
    for _ in range(5):
        proc = supervisor("two.yml")
        wait_for(lambda proc=proc: children(proc.pid), message="a forked child")
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=1 + 5) == 0
        assert time.monotonic() - started < 1 + 5


def term_caught(pid: int) -> bool:
    """Whether ``pid`` has a handler for TERM (the interpreter itself sets none)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def session(pid: int) -> list[int]:
    """Every process still in the session ``limitd start`` leads (its children, the
    programs they ran), zombies left out."""
    out = subprocess.run(["pgrep", "-s", str(pid)], capture_output=True, text=True, check=False)
    return [int(member) for member in out.stdout.split() if running(int(member))]


@pytest.mark.parametrize("delay", [0, 0.002, 0.01, 0.03, 0.1, 0.2, 0.4, 0.8, 1.5])
def test_term_at_any_moment_of_start_up_stops_cleanly(
    supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis, delay: float
) -> None:
    """From its first statement ``limitd start`` records signals for the supervisor:
    a TERM while it loads the config, imports the app, connects or forks is a graceful
    stop (status 0, no process left behind), never the default action. The delay runs
    from the moment its TERM handler is visible in /proc; before that only the
    interpreter and ``import limitd`` run, and nothing exists to leave behind."""
    proc = supervisor("two.yml")
    wait_for(lambda: proc.poll() is not None or term_caught(proc.pid), message="handlers")
    time.sleep(delay)  # not a hope: the point of start-up this TERM is sent at
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=1 + 5 + 10) == 0
    wait_for(lambda: not session(proc.pid), message="no process left")
    assert len(Processes(redis)) == 0
    assert redis.scard(keys.of(redis).CAPSULES) == 0


def test_term_before_limitd_runs_leaves_nothing(
    supervisor: Callable[..., subprocess.Popen[bytes]], redis: redis_py.Redis
) -> None:
    """A TERM sent the instant the process exists may reach the interpreter before any
    of limitd's code: the default action then ends it (-15), which must leave nothing."""
    for _ in range(5):
        proc = supervisor("two.yml")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=1 + 5 + 10) in (0, -signal.SIGTERM)
        wait_for(lambda proc=proc: not session(proc.pid), message="no process left")
        assert redis.scard(keys.of(redis).CAPSULES) == 0


def test_a_capsule_of_many_queues_names_the_first_and_counts_the_rest() -> None:
    """The title is rewritten up to ten times a second: with 10,000 queues it names 20
    and says how many more, rather than joining them all each time."""
    many = [f"q{i:05d}" for i in range(10_000)]
    title = capsule_title("default", "", 3, 10, many)
    assert title.endswith("queues: " + ", ".join(many[:20]) + " and 9,980 more")
    assert capsule_title("default", "", 0, 10, many[:20]).endswith(", ".join(many[:20]))
