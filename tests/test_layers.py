"""limitd's layers import downward only, and the folders say which layer a module is in.

Every ``import`` and ``from ... import`` statement in the package (at the top of a module,
inside a function or under ``TYPE_CHECKING``: a late import is still a dependency) is
read with ``ast`` and checked: a module may import modules of its own layer and of the
layers under it. The client side and the server side share a rank but do not import
each other.

Where a module sits follows from its folder (``FOLDERS``): ``connection/`` is the bottom,
``queues/`` the queue model that config, the admin API and the fetch all read, and so on
up to the front ends. A feature folder (``batch``, ``unique``, ``fair_tenant``...) plugs a
module into each layer it touches, and those modules are named for their role
(``ROLES``): a feature's ``store`` and ``middleware`` sit with the middleware, its
``section`` with the config, its ``admin``, ``commands`` and ``plug`` on top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "limitd"

BOTTOM, SPEC, MIDDLEWARE, CONFIG, SIDES, TOP = 0, 1, 2, 3, 4, 5
Layer = tuple[int, str]  # (rank, side): side is "client", "server" or "" (both may use it)

FOLDERS: dict[str, Layer] = {
    # bottom: the Redis plumbing, key names, the payload format, time
    "limitd.connection": (BOTTOM, ""),
    "limitd.keys": (BOTTOM, ""),
    "limitd.payload": (BOTTOM, ""),
    "limitd.codec": (BOTTOM, ""),  # the payload's JSON
    "limitd.clock": (BOTTOM, ""),
    "limitd.handoff": (BOTTOM, ""),
    "limitd.options": (BOTTOM, ""),
    "limitd.version": (BOTTOM, ""),
    # the job spec: what a job is, which jobs exist, which features are in use
    "limitd.spec": (SPEC, ""),
    "limitd.registry": (SPEC, ""),
    "limitd.plugins": (SPEC, ""),
    # the middleware chains, retries, and the queue model
    "limitd.middleware": (MIDDLEWARE, ""),
    "limitd.retry": (MIDDLEWARE, ""),
    "limitd.queues": (MIDDLEWARE, ""),
    "limitd.app_hooks": (MIDDLEWARE, ""),  # what app code declares: handlers, middleware, hooks
    # configuration, and where Redis is
    "limitd.config": (CONFIG, ""),
    "limitd.locate": (CONFIG, ""),
    # the client side and the server side, beside each other
    "limitd.client": (SIDES, "client"),
    "limitd.job": (SIDES, "client"),
    "limitd.aio": (SIDES, "client"),
    "limitd.arguments": (SIDES, "client"),
    "limitd.fetch": (SIDES, "server"),
    "limitd.supervisor": (SIDES, "server"),
    "limitd.logs": (SIDES, "server"),
    # on top: the admin API, the command line, the web front end, the list of features
    "limitd.api": (TOP, ""),
    "limitd.commands": (TOP, ""),
    "limitd.cli": (TOP, ""),
    "limitd.web": (TOP, ""),
    "limitd.features": (TOP, ""),
    "limitd.testing": (TOP, ""),  # the testing modes: a default client, a capsule's chain
}
FEATURES = (
    "limitd.batch",
    "limitd.capacity",
    "limitd.expiry",
    "limitd.encryption",
    "limitd.fair_queues",
    "limitd.fair_tenant",
    "limitd.iteration",
    "limitd.job_history",
    "limitd.limiters",
    "limitd.periodic",
    "limitd.metrics",
    "limitd.outbox",
    "limitd.time_limits",
    "limitd.tracing",
    "limitd.reliable_push",
    "limitd.transactions",
    "limitd.unique",
)
ROLES: dict[str, Layer] = {
    # the feature's share of the job's fate: its Redis state and its middleware
    "store": (MIDDLEWARE, ""),
    "middleware": (MIDDLEWARE, ""),
    "building": (MIDDLEWARE, ""),  # batch: the batch being built, seen by its middleware
    "leases": (MIDDLEWARE, ""),  # capacity: the lease a job holds
    "hold": (MIDDLEWARE, ""),  # transactions: pushes held until commit
    "held": (MIDDLEWARE, ""),  # outbox: the rows held in the app's database
    "table": (MIDDLEWARE, ""),  # outbox: the table's definition
    "jobs": (MIDDLEWARE, ""),  # metrics: the job metrics middleware
    "cipher": (MIDDLEWARE, ""),  # encryption: the keyring and the sealed arguments
    "watchdog": (MIDDLEWARE, ""),  # time limits: the deadlines of running jobs
    # the feature's config section and its checks
    "section": (CONFIG, ""),
    "checks": (CONFIG, ""),
    # what app code calls
    "app": (SIDES, "client"),  # batch.app (Batch), transactions.app (transaction_aware)
    "job": (SIDES, "client"),
    "run": (SIDES, "client"),  # iteration: one run of an iterable job, its decisions and loop
    "limiter": (SIDES, "client"),
    "aio": (SIDES, "client"),
    "tries": (SIDES, "client"),
    "scheduler": (SIDES, "client"),
    "relay": (SIDES, "client"),
    "django": (SIDES, "client"),
    "sqlalchemy": (SIDES, "client"),
    # the feature's admin API, commands, metrics and plug
    "admin": (TOP, ""),
    "commands": (TOP, ""),
    "metrics": (TOP, ""),
    "exporter": (TOP, ""),
    "process": (TOP, ""),
    "plug": (TOP, ""),
}
PUBLIC_PACKAGE = "limitd"  # its __init__ re-exports the public API: on top


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> Layer:
    """A feature folder's module by its role; any other by its folder; a feature
    folder's ``__init__`` (a docstring: importing any of its modules runs it) at the
    bottom."""
    if module in FEATURES:
        return (BOTTOM, "")
    if module == PUBLIC_PACKAGE:
        return (TOP, "")
    folder, _, role = module.rpartition(".")
    if folder in FEATURES:
        if role not in ROLES:
            raise AssertionError(
                f"{module}: no layer for the role {role!r}: see ROLES in {__file__}"
            )
        return ROLES[role]
    prefixes = [name for name in FOLDERS if module == name or module.startswith(name + ".")]
    if not prefixes:
        raise AssertionError(f"{module} has no layer: add its folder to FOLDERS in {__file__}")
    return FOLDERS[max(prefixes, key=len)]


def imported_modules(tree: ast.AST, module: str) -> set[str]:
    """The limitd modules a module imports (``from limitd.x import y`` counts as x.y
    when y is a module, else x)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("limitd"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("limitd"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if _is_module(candidate) else node.module)
    found.discard(module)
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def modules() -> list[tuple[str, Path]]:
    return sorted((module_name(path), path) for path in PACKAGE.rglob("*.py"))


def upward_imports() -> list[str]:
    problems = []
    for module, path in modules():
        rank, side = layer_of(module)
        for target in sorted(imported_modules(ast.parse(path.read_text()), module)):
            target_rank, target_side = layer_of(target)
            if target_rank > rank or (
                target_rank == rank and side and target_side not in ("", side)
            ):
                problems.append(
                    f"{module} (layer {rank} {side}) imports {target} "
                    f"(layer {target_rank} {target_side})"
                )
    return problems


def test_every_module_has_a_layer() -> None:
    for module, _ in modules():
        layer_of(module)


def test_no_module_imports_upward() -> None:
    assert upward_imports() == []


@pytest.mark.parametrize("folder", FEATURES)
def test_feature_folders_import_nothing_from_their_init(folder: str) -> None:
    init = PACKAGE.parent.joinpath(*folder.split("."), "__init__.py")
    assert imported_modules(ast.parse(init.read_text()), folder) == set()


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The check itself: a bottom module importing the client is reported."""
    tree = ast.parse("from limitd.client import Client\n")
    assert imported_modules(tree, "limitd.keys") == {"limitd.client"}
    assert layer_of("limitd.client")[0] > layer_of("limitd.keys")[0]
