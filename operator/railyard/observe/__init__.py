"""What the operator observes of running jobs: heartbeat ingest and store, health metrics."""
