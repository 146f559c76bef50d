"""Expiring jobs (Sidekiq Pro's ``expires_in``): a job that has not started by its
deadline is dropped instead of run.

A feature folder: ``plug`` (declares the ``expires_in`` option and registers the
feature; all that ``import limitd`` loads) and ``middleware`` (client: stamp the
deadline in the payload; server: drop a job past it before it runs). See
``limitd.plugins`` and docs/features/expiring-jobs.md.
"""
