"""Railyard's single-machine Kubernetes cluster (distribution railyard-local, local_cluster/): an
embedded API server (apiserver/), a scheduler (scheduler.py, scheduling.py) and a node agent that
runs pods as processes (agent.py). A tool next to the operator, not part of it: the operator image
does not carry it, and only ``railyard demo`` and ``railyard local`` import it (docs/local-cluster.md).
"""
