"""A small app for the quick start: a few jobs for two tenants, a limited queue.

    limitd start conf/example.yml
    limitd -C conf/example.yml enqueue examples.demo.fan_out '[20]'
    limitd -C conf/example.yml queues
    limitd -C conf/example.yml batches
"""

from __future__ import annotations

import logging
import random
import time

import limitd

log = logging.getLogger("demo")
TENANTS = ("acme", "globex")


@limitd.job
def greet(name: str) -> None:
    log.info("hello, %s", name)


@limitd.job(queue="reports", retry=3)
def build_report(tenant: str, number: int) -> None:
    """Limited to 2 at once by conf/example.yml; about 1 in 10 fails and is retried."""
    time.sleep(random.uniform(0.2, 0.6))  # pretend to query the reporting database
    if random.random() < 0.1:
        raise RuntimeError(f"report {number} for {tenant}: reporting database timed out")
    log.info("report %d for %s done", number, tenant)


@limitd.job(queue="exports")
def export_tenant(tenant: str) -> None:
    time.sleep(1.0)  # pretend to write a large file
    log.info("export for %s written", tenant)


@limitd.job
def reports_finished(status: dict, options: dict) -> None:
    """The batch callback: every report has run (some may still be retrying)."""
    log.info(
        "batch %r complete: %d jobs, %d of them failing (retrying or dead)",
        status["description"],
        status["total"],
        status["failures"],
    )


@limitd.job
def fan_out(count: int) -> None:
    """Enqueue ``count`` reports spread over the tenants in one bulk push (as a batch,
    with a callback when all have run), an export per tenant, and a greeting."""
    batch = limitd.Batch(f"{count} reports").on("complete", reports_finished)
    with batch.jobs():
        build_report.perform_bulk([[random.choice(TENANTS), n] for n in range(count)])
    export_tenant.perform_bulk([[tenant] for tenant in TENANTS])
    greet.perform_async("world")
