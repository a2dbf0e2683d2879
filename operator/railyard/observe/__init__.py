"""Observability: Prometheus metrics and the heartbeat ingest endpoint (I/O layer)."""
