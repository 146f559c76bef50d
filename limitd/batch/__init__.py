"""Batches: a group of jobs, then callbacks once it completes or succeeds.

A feature folder, one module per layer: ``store`` (the batch's Redis state and its Lua
scripts), ``building`` (which batch this thread adds to), ``middleware`` (client: tag and
count jobs; server: record each run), ``app`` (``limitd.Batch``, what app code calls),
``admin`` (listing and status for operators), ``commands`` (``limitd batches``) and
``plug`` (registers the feature). Import ``limitd.Batch`` rather than these modules.
"""
