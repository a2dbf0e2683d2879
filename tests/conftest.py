"""Shared test configuration.

Markers (``--strict-markers``): ``torch`` (multi-process trainer tests), ``cluster`` (needs a
Kubernetes API: the embedded local cluster is started when none is given), ``e2e`` (needs a real
cluster: kind through pytest-kind, or ``RAILYARD_TEST_KUBECONFIG``; skipped otherwise), ``slow``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
