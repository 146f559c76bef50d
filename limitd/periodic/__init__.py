"""Periodic (cron) jobs: the ``periodic:`` config section, and a scheduler in every
capsule process that enqueues each tick exactly once across all of them."""
