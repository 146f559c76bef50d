"""Unique jobs: an identical job is not enqueued while a copy holds its lock.

A feature folder: ``middleware`` (client: take the lock; server: release it, with its
Lua scripts) and ``plug`` (registers the feature). See ``limitd.plugins``.
"""
