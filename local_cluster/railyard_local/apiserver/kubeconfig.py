"""A kubeconfig for the embedded server that kubectl and the kubernetes client use as is.

One implementation for the whole local cluster: :mod:`railyard_local.kubeconfig`.
"""

from __future__ import annotations

from railyard_local.kubeconfig import build_kubeconfig, write_kubeconfig

__all__ = ["build_kubeconfig", "write_kubeconfig"]
