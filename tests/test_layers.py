"""limitd's layers import downward only.

Every ``import`` and ``from ... import`` statement in the package (at the top of a module,
inside a function or under ``TYPE_CHECKING``: a late import is still a dependency) is
read with ``ast`` and checked against the layer map below: a module may import modules of
its own layer and of the layers under it. The client side and the server side share a
rank but do not import each other. A feature folder (``batch``, ``unique``,
``fair_tenant``) has a module in each layer it touches, so modules are placed by their
own name, not by their folder.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "limitd"

# (rank, side) per layer; a module's layer is the longest prefix of its name listed here.
BOTTOM, SPEC, MIDDLEWARE, CONFIG, SIDES, TOP = 0, 1, 2, 3, 4, 5
LAYERS: dict[str, tuple[int, str]] = {
    # bottom: data formats, key names, connections, time
    "limitd.clock": (BOTTOM, ""),
    "limitd.keys": (BOTTOM, ""),
    "limitd.payload": (BOTTOM, ""),
    "limitd.redis": (BOTTOM, ""),
    "limitd.pinned": (BOTTOM, ""),
    "limitd.sentinel": (BOTTOM, ""),
    "limitd.handoff": (BOTTOM, ""),
    "limitd.hosts": (BOTTOM, ""),
    "limitd.cluster": (BOTTOM, ""),
    "limitd.replication": (BOTTOM, ""),
    "limitd.backoff": (BOTTOM, ""),
    "limitd.embedded": (BOTTOM, ""),
    "limitd.options": (BOTTOM, ""),
    "limitd.version": (BOTTOM, ""),
    # the job spec: what a job is, which jobs exist, which features are in use
    "limitd.spec": (SPEC, ""),
    "limitd.registry": (SPEC, ""),
    "limitd.plugins": (SPEC, ""),
    # middleware and the pieces of the job's fate they share
    "limitd.middleware": (MIDDLEWARE, ""),
    "limitd.retry": (MIDDLEWARE, ""),
    "limitd.batch.store": (MIDDLEWARE, ""),
    "limitd.batch.building": (MIDDLEWARE, ""),
    "limitd.batch.middleware": (MIDDLEWARE, ""),
    "limitd.unique.middleware": (MIDDLEWARE, ""),
    "limitd.fair_tenant.middleware": (MIDDLEWARE, ""),
    "limitd.limiters.store": (MIDDLEWARE, ""),
    "limitd.limiters.middleware": (MIDDLEWARE, ""),
    "limitd.fetch.order": (MIDDLEWARE, ""),
    "limitd.fetch.limits": (MIDDLEWARE, ""),
    "limitd.fetch.rates": (MIDDLEWARE, ""),
    "limitd.fetch.per_queue": (MIDDLEWARE, ""),
    "limitd.fetch.recoveries": (MIDDLEWARE, ""),
    "limitd.capacity.store": (MIDDLEWARE, ""),
    "limitd.capacity.leases": (MIDDLEWARE, ""),
    "limitd.transactions.hold": (MIDDLEWARE, ""),
    "limitd.periodic.store": (MIDDLEWARE, ""),
    "limitd.metrics.jobs": (MIDDLEWARE, ""),
    "limitd.outbox.table": (MIDDLEWARE, ""),
    "limitd.outbox.held": (MIDDLEWARE, ""),
    # configuration, and where Redis is
    "limitd.config": (CONFIG, ""),
    "limitd.fair_tenant.section": (CONFIG, ""),
    "limitd.fair_tenant.checks": (CONFIG, ""),
    "limitd.periodic.section": (CONFIG, ""),
    "limitd.periodic.checks": (CONFIG, ""),
    "limitd.metrics.section": (CONFIG, ""),
    "limitd.outbox.section": (CONFIG, ""),
    "limitd.locate": (CONFIG, ""),
    # the client side and the server side, beside each other
    "limitd.client": (SIDES, "client"),
    "limitd.aio": (SIDES, "client"),
    "limitd.job": (SIDES, "client"),
    "limitd.batch.api": (SIDES, "client"),
    "limitd.limiters.limiter": (SIDES, "client"),
    "limitd.limiters.aio": (SIDES, "client"),
    "limitd.limiters.tries": (SIDES, "client"),
    "limitd.capacity.job": (SIDES, "client"),
    "limitd.periodic.scheduler": (SIDES, "client"),
    "limitd.transactions.sqlalchemy": (SIDES, "client"),
    "limitd.transactions.django": (SIDES, "client"),
    "limitd.transactions.api": (SIDES, "client"),
    "limitd.outbox.relay": (SIDES, "client"),
    "limitd.fetch": (SIDES, "server"),
    "limitd.supervisor": (SIDES, "server"),
    "limitd.logs": (SIDES, "server"),
    # on top: the admin API, the command line, the feature plugs, the public package
    "limitd.api": (TOP, ""),
    "limitd.batch.admin": (TOP, ""),
    "limitd.fair_tenant.admin": (TOP, ""),
    "limitd.limiters.admin": (TOP, ""),
    "limitd.capacity.admin": (TOP, ""),
    "limitd.periodic.admin": (TOP, ""),
    "limitd.commands": (TOP, ""),
    "limitd.batch.commands": (TOP, ""),
    "limitd.fair_tenant.commands": (TOP, ""),
    "limitd.limiters.commands": (TOP, ""),
    "limitd.capacity.commands": (TOP, ""),
    "limitd.periodic.commands": (TOP, ""),
    "limitd.metrics.commands": (TOP, ""),
    "limitd.outbox.commands": (TOP, ""),
    "limitd.capacity.metrics": (TOP, ""),
    "limitd.periodic.metrics": (TOP, ""),
    "limitd.fair_tenant.metrics": (TOP, ""),
    "limitd.metrics.exporter": (TOP, ""),
    "limitd.metrics.process": (TOP, ""),
    "limitd.web": (TOP, ""),
    "limitd.batch.plug": (TOP, ""),
    "limitd.unique.plug": (TOP, ""),
    "limitd.fair_tenant.plug": (TOP, ""),
    "limitd.limiters.plug": (TOP, ""),
    "limitd.capacity.plug": (TOP, ""),
    "limitd.periodic.plug": (TOP, ""),
    "limitd.metrics.plug": (TOP, ""),
    "limitd.outbox.plug": (TOP, ""),
    "limitd.features": (TOP, ""),
    "limitd.cli": (TOP, ""),
}
PUBLIC_PACKAGE = "limitd"  # its __init__ re-exports the public API: on top
# Feature folders' __init__ modules hold only a docstring: importing one of their modules
# runs them, so they must stay at the bottom.
DOCSTRING_ONLY = (
    "limitd.batch",
    "limitd.unique",
    "limitd.fair_tenant",
    "limitd.limiters",
    "limitd.capacity",
    "limitd.periodic",
    "limitd.metrics",
    "limitd.transactions",
    "limitd.outbox",
    "limitd.aio",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> tuple[int, str]:
    if module in DOCSTRING_ONLY:
        return (BOTTOM, "")
    if module == PUBLIC_PACKAGE:
        return (TOP, "")
    prefixes = [name for name in LAYERS if module == name or module.startswith(name + ".")]
    if not prefixes:
        raise AssertionError(f"{module} has no layer: add it to LAYERS in {__file__}")
    return LAYERS[max(prefixes, key=len)]


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


@pytest.mark.parametrize("folder", DOCSTRING_ONLY)
def test_feature_folders_import_nothing_from_their_init(folder: str) -> None:
    init = PACKAGE.parent.joinpath(*folder.split("."), "__init__.py")
    assert imported_modules(ast.parse(init.read_text()), folder) == set()


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The check itself: a bottom module importing the client is reported."""
    tree = ast.parse("from limitd.client import Client\n")
    assert imported_modules(tree, "limitd.keys") == {"limitd.client"}
    assert layer_of("limitd.client")[0] > layer_of("limitd.keys")[0]
