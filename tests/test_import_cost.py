"""What ``import limitd`` costs app code that only enqueues.

App code imports limitd in every web worker and script, so the package loads the client
side and the features' client-side pieces (middleware, job options, config sections),
and nothing of the command line, the admin API, the metrics exporter or the web front
end: those load when ``limitd start``, ``limitd metrics``, ``limitd web``, a CLI command
or an explicit ``import limitd.api`` asks for them. Each check runs in a fresh
interpreter, since this one has imported everything already.

Before the feature plugs loaded their heavy pieces on use, ``import limitd`` loaded 140
limitd modules; after, 87. The fetch package's protocols importing its implementations
only for type checking took limitd.fetch.basic, .limit and .wakeup out (96 -> 93, with
the core split into more, smaller modules meanwhile).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import limitd
from limitd.cli import build_parser
from limitd.connection.embedded import RedisServer
from limitd.plugins import registered

# The count with headroom for the core's own modules to grow or split (it was 140
# when every feature's commands, admin calls and metrics came with the package).
# Time limits: limitd.time_limits and its plug (which declares ``time_limit``), 2 modules.
# Encrypted arguments: limitd.encryption and its plug (which declares ``encrypt``), 2.
# Job history: limitd.job_history (the section's key names) and its plug, 2.
# Expiring jobs: limitd.expiry and its plug (which declares ``expires_in``), 2.
# Iterable jobs: limitd.iteration, its plug, its job (``limitd.IterableJob``) and app
# (``limitd.cancelled``), 4; the run loop and its store load with the first run.
# Fair queues: limitd.fair_queues, its plug, its section (the config's key names) and
# its store (the settings the section checks; its scripts are read when first used), 4.
# Payload JSON (limitd.codec: orjson or the standard library, one place for both), 1.
# The fetch as a Redis function (limitd.connection.functions, beside the scripts), 1.
MOST_LIMITD_MODULES = 117

# Packages that only the command line, the admin API, metrics or the web front end use,
# and the server's fetch and supervisor (the server imports them; app code never does).
HEAVY_PACKAGES = (
    "limitd.api",
    "limitd.cli",
    "limitd.commands",
    "limitd.supervisor",
    "limitd.fetch.basic",
    "limitd.fetch.limit",
    "limitd.fetch.wakeup",
    "limitd.fetch.dispatcher",
    "limitd.metrics.exporter",
    "limitd.metrics.process",
    "limitd.metrics.commands",
    "argparse",
    "prometheus_client",
    "starlette",
    "jinja2",
    "a2wsgi",
    "uvicorn",
    "sqlalchemy",
)
# In each feature folder, the modules for the command line, the admin API and metrics.
HEAVY_FEATURE_MODULES = ("commands", "admin", "metrics")
# What of limitd.web may load: its docstring-only package and the plug naming `limitd web`.
LIGHT_WEB = {"limitd.web", "limitd.web.plug"}

APP = """
import json, sys
import limitd

@limitd.job(name="import_cost.Report", queue="reports", retry=3, unique_for=60)
def report(account_id):
    pass

{body}
print(json.dumps(sorted(sys.modules)))
"""


def modules_after(body: str = "") -> list[str]:
    """The modules loaded by a fresh interpreter running app code ``body``."""
    script = APP.format(body=textwrap.dedent(body))
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=60
    )
    loaded: list[str] = json.loads(out.stdout.splitlines()[-1])
    return loaded


def heavy(modules: list[str]) -> list[str]:
    def is_heavy(name: str) -> bool:
        if any(name == p or name.startswith(p + ".") for p in HEAVY_PACKAGES):
            return True
        if name.startswith("limitd.web"):
            return name not in LIGHT_WEB
        parts = name.split(".")
        return parts[0] == "limitd" and len(parts) == 3 and parts[2] in HEAVY_FEATURE_MODULES

    return [name for name in modules if is_heavy(name)]


def test_import_limitd_loads_no_command_line_admin_metrics_or_web() -> None:
    loaded = modules_after()
    ours = [name for name in loaded if name == "limitd" or name.startswith("limitd.")]
    print(f"import limitd: {len(ours)} limitd modules, {len(loaded)} in all")
    assert heavy(loaded) == []
    assert len(ours) <= MOST_LIMITD_MODULES


def test_enqueueing_loads_no_command_line_admin_metrics_or_web(
    redis_server: RedisServer,
) -> None:
    """The app's whole enqueueing surface, used for real against Redis."""
    loaded = modules_after(f"""
        import limitd.aio
        limitd.configure(url={redis_server.url!r})
        report.perform_async(1)
        report.set(queue="later").perform_in(30, 2)
        report.perform_bulk([[3], [4]])
        batch = limitd.Batch(description="nightly")
        with batch.jobs():
            report.perform_async(5)
        limitd.Limiter.window("import-cost", 10, "minute", wait_timeout=0)
    """)
    assert heavy(loaded) == []


def test_every_public_name_imports_from_limitd() -> None:
    for name in limitd.__all__:
        assert getattr(limitd, name) is not None, name


def test_the_command_line_finds_every_feature_command() -> None:
    """The plugs import their commands when the parser is built."""
    parser = build_parser()
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    choices = set(subparsers.choices)
    wanted = {"batches", "tenants", "limiters", "capacity", "periodic", "metrics", "outbox"}
    assert wanted | {"web", "start", "check", "enqueue", "status", "queues"} <= choices
    commandless = ("unique", "tracing", "expiry", "encryption", "time_limits")
    assert all(f.add_commands is not None for f in registered() if f.name not in commandless)


def test_the_admin_api_loads_when_imported() -> None:
    loaded = modules_after("import limitd.api")
    assert {"limitd.batch.admin", "limitd.fair_tenant.admin", "limitd.periodic.admin"} <= set(
        loaded
    )
    assert "argparse" not in loaded and "prometheus_client" not in loaded


def test_the_command_line_loads_metrics_and_web_only_for_their_commands() -> None:
    """Every ``limitd`` command builds the whole parser: building it must not load what
    only ``limitd metrics`` and ``limitd web`` serve with."""
    loaded = set(modules_after("from limitd.cli import build_parser; build_parser()"))
    assert loaded.isdisjoint({"prometheus_client", "starlette", "jinja2", "a2wsgi"})
    assert loaded.isdisjoint({"limitd.metrics.exporter", "limitd.web.application"})


def test_each_feature_admin_and_commands_module_imports_alone() -> None:
    """Each feature folder's admin and commands module, imported first and alone in a
    fresh interpreter (one subprocess each): a feature admin module that imported the
    ``limitd.api`` package, which imports the feature admin modules back, would fail
    half-initialised."""
    package = Path(limitd.__file__).parent
    modules = sorted(
        f"limitd.{path.parent.name}.{path.stem}"
        for role in ("admin", "commands")
        for path in package.glob(f"*/{role}.py")
    )
    assert {"limitd.periodic.admin", "limitd.fair_tenant.admin"} <= set(modules)
    failed = {}
    for name in modules:
        done = subprocess.run(
            [sys.executable, "-c", f"import {name}"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode:
            failed[name] = done.stderr.strip().splitlines()[-1]
    print(f"{len(modules)} feature admin/commands modules imported alone")
    assert failed == {}
