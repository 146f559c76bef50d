"""Prometheus metrics: ``limitd metrics``, a standalone exporter of cluster-wide state
read from Redis at each scrape, and per-process job metrics served by each capsule."""
