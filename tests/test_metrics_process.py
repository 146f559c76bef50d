"""Per-process job metrics in this process: the ``metrics:`` section and its errors, the
server middleware that counts jobs by outcome and times them, and the service that
serves them on ``port + process_number`` and stops serving on ``stop``."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from prometheus_client import CollectorRegistry, generate_latest

from limitd import clock
from limitd.config import CapsuleConfig, CapsuleSpec, Config, ConfigError, load_config
from limitd.metrics.jobs import JobMetrics
from limitd.metrics.process import ProcessMetrics, process_services
from limitd.metrics.section import MetricsSettings, check_ports
from limitd.middleware.chain import ServerChain
from limitd.plugins import ProcessContext
from limitd.spec import JobSpec
from tests.test_metrics_exporter import Samples, parse, value

SPEC = JobSpec(name="app.Send", origin="tests", run=lambda payload: None)


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive TCP ports free on 127.0.0.1 now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        if first + count > 65_536:
            continue
        if all(_free(first + offset) for offset in range(count)):
            return first
    raise AssertionError(f"no {count} consecutive free ports found")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def get_metrics(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return parse(reply.read().decode())


def write(tmp_path: Path, text: str, name: str = "app.yml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# the metrics: section


def test_the_section_gives_the_port_and_address(tmp_path: Path) -> None:
    path = write(tmp_path, "metrics: {port: 9300, bind: 0.0.0.0}\n")
    settings = load_config([path]).section("metrics")
    assert settings == MetricsSettings(port=9300, bind="0.0.0.0")
    assert settings.port_of(3) == 9303
    assert settings.source == str(path)
    assert load_config([]).section("metrics") == MetricsSettings()
    assert not load_config([]).section("metrics").enabled


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("metrics: {port: 0}", "metrics.port", "expected an integer >= 1, got 0"),
        ("metrics: {port: 70000}", "metrics.port", "expected a TCP port from 1 to 65535"),
        ("metrics: {port: '9300'}", "metrics.port", "expected an integer >= 1"),
        ("metrics: {bind: 0.0.0.0}", "metrics.port", "expected a TCP port (bind is set"),
        ("metrics: {port: 9300, bind: 'not an address'}", "metrics.bind", "expected an IP"),
        ("metrics: {prot: 9300}", "metrics.prot", "unknown key; did you mean 'port'?"),
        ("metrics: 9300", "metrics", "expected a mapping, got 9300"),
    ],
)
def test_section_mistakes_name_the_file_key_and_expected_value(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config([path])
    assert caught.value.file == str(path)
    assert caught.value.key == key
    assert expected in caught.value.message


def test_every_process_needs_a_port_below_65536(tmp_path: Path) -> None:
    path = write(tmp_path, "metrics: {port: 65534}\nqueues: [a]\nprocesses: 3\n")
    config = load_config([path])
    with pytest.raises(ConfigError) as caught:
        check_ports(config, [])
    assert (caught.value.file, caught.value.key) == (str(path), "metrics.port")
    assert "expected a port <= 65533" in caught.value.message
    write(tmp_path, "metrics: {port: 65533}\nqueues: [a]\nprocesses: 3\n")
    check_ports(load_config([path]), [])


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "limitd.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


def test_check_and_start_exit_78_naming_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    write(tmp_path, "queues: [a]\nmetrics:\n  port: 9300\n  bind: 'x y'\n", "conf/app.yml")
    for command in ("check", "start"):
        out = run_cli(tmp_path, command, "conf/app.yml")
        assert out.returncode == 78, out.stderr
        assert "conf/app.yml: metrics.bind: expected an IP address" in out.stderr
    write(tmp_path, "queues: [a]\nprocesses: 2\nmetrics: {port: 65535}\n", "conf/app.yml")
    out = run_cli(tmp_path, "start", "conf/app.yml")
    assert out.returncode == 78, out.stderr
    assert "conf/app.yml: metrics.port: expected a port <= 65534" in out.stderr


def test_check_prints_the_section_as_it_reads_it_back(tmp_path: Path) -> None:
    write(tmp_path, "queues: [a]\nmetrics: {port: 9300}\n", "app.yml")
    out = run_cli(tmp_path, "check", "app.yml")
    assert out.returncode == 0, out.stderr
    assert "metrics:\n  port: 9300\n  bind: 127.0.0.1\n" in out.stdout
    (tmp_path / "printed.yml").write_text(out.stdout)
    assert load_config([tmp_path / "printed.yml"]).section("metrics").port == 9300
    write(tmp_path, "queues: [a]\n", "app.yml")
    out = run_cli(tmp_path, "check", "app.yml")
    assert out.returncode == 0, out.stderr
    assert "metrics:\n  port: null\n  bind: null\n" in out.stdout
    (tmp_path / "printed.yml").write_text(out.stdout)
    assert not load_config([tmp_path / "printed.yml"]).section("metrics").enabled


# the middleware


@pytest.fixture
def ticking(monkeypatch: pytest.MonkeyPatch) -> None:
    """``clock.monotonic`` advances 0.25 s at each read."""
    times = iter(range(10_000))
    monkeypatch.setattr(clock, "monotonic", lambda: next(times) * 0.25)


def run_job(chain: ServerChain, outcome: str, queue: str = "mail", jid: str = "j1") -> None:
    """What the executor does: the chain around perform, then ``settle``."""
    payload: dict[str, Any] = {"class": SPEC.name, "jid": jid, "args": []}
    try:
        chain.invoke(SPEC, payload, queue, lambda: _perform(outcome))
    except RuntimeError as exc:
        chain.settle(SPEC, payload, queue, outcome, exc)
    else:
        chain.settle(SPEC, payload, queue, outcome, None)


def _perform(outcome: str) -> None:
    if outcome in ("retry", "dead", "discarded"):
        raise RuntimeError("failed")


def registry_samples(registry: CollectorRegistry) -> Samples:
    return parse(generate_latest(registry).decode())


@pytest.mark.usefixtures("ticking")
def test_jobs_are_counted_by_outcome_and_timed() -> None:
    registry = CollectorRegistry()
    chain = ServerChain([JobMetrics(registry)])
    for outcome in ("done", "done", "retry", "dead", "discarded", "rescheduled"):
        run_job(chain, outcome)
    run_job(chain, "done", queue="other")
    samples = registry_samples(registry)
    total = "limitd_jobs_total"
    assert value(samples, total, job_class=SPEC.name, queue="mail", outcome="done") == 2
    for outcome in ("retry", "dead", "discarded", "rescheduled"):
        assert value(samples, total, job_class=SPEC.name, queue="mail", outcome=outcome) == 1
    assert value(samples, total, job_class=SPEC.name, queue="other", outcome="done") == 1
    count = "limitd_job_duration_seconds_count"
    assert value(samples, count, job_class=SPEC.name, queue="mail") == 6
    assert (
        value(samples, "limitd_job_duration_seconds_sum", job_class=SPEC.name, queue="mail") == 1.5
    )
    bucket = "limitd_job_duration_seconds_bucket"
    assert value(samples, bucket, job_class=SPEC.name, queue="mail", le="0.1") == 0
    assert value(samples, bucket, job_class=SPEC.name, queue="mail", le="0.25") == 6


def test_a_job_that_never_reached_the_chain_is_counted_not_timed() -> None:
    registry = CollectorRegistry()
    chain = ServerChain([JobMetrics(registry)])
    run_job(chain, "done", jid="ran")
    payload = {"class": "app.Unknown", "jid": "unknown", "args": []}
    chain.settle(None, payload, "mail", "retry", RuntimeError("no such job"))
    samples = registry_samples(registry)
    labels = {"job_class": "app.Unknown", "queue": "mail"}
    assert value(samples, "limitd_jobs_total", outcome="retry", **labels) == 1
    assert ("limitd_job_duration_seconds_count", tuple(sorted(labels.items()))) not in samples


# the service


@pytest.fixture
def context(redis: redis_py.Redis) -> Iterator[ProcessContext]:
    port = free_ports(2)
    settings = MetricsSettings(port=port)
    capsule = CapsuleConfig(name="mail", process_number=1)
    yield ProcessContext(redis, {"metrics": settings}, capsule, ServerChain())


def test_the_service_serves_on_port_plus_process_number_until_stopped(
    context: ProcessContext,
) -> None:
    [service] = process_services(context)
    assert isinstance(service, ProcessMetrics)
    port = context.section("metrics").port + 1
    service.start()
    try:
        assert JobMetrics in context.chain
        run_job(context.chain, "done")
        samples = get_metrics(port)
        assert value(samples, "limitd_process_info", capsule="mail", process_number="1") == 1
        labels = {"job_class": SPEC.name, "queue": "mail", "outcome": "done"}
        assert value(samples, "limitd_jobs_total", **labels) == 1
        assert any(name == "process_cpu_seconds_total" for name, _ in samples)
    finally:
        service.stop()
    with pytest.raises(urllib.error.URLError):
        get_metrics(port)
    service.stop()  # a second stop does nothing


def test_a_taken_port_stops_the_start_and_names_the_port(context: ProcessContext) -> None:
    port = context.section("metrics").port + 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        [service] = process_services(context)
        with pytest.raises(OSError, match=f"127.0.0.1:{port} .*process number 1"):
            service.start()
    assert JobMetrics not in context.chain
    service.stop()


def test_no_port_no_service(redis: redis_py.Redis) -> None:
    for sections in ({}, {"metrics": MetricsSettings()}):
        context = ProcessContext(redis, sections, CapsuleConfig(), ServerChain())
        assert process_services(context) == []


def test_check_app_runs_the_port_check() -> None:
    spec = CapsuleSpec(CapsuleConfig(queues=["a"]), processes=2)
    config = Config(files=["x.yml"], capsules=[spec], sections={})
    check_ports(config, [])  # no metrics section loaded: nothing to check
    config.sections["metrics"] = MetricsSettings(port=65535, source="x.yml")
    with pytest.raises(ConfigError, match=r"x\.yml: metrics\.port"):
        check_ports(config, [])
