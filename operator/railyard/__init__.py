"""Railyard: rail-aware, failure-tolerant distributed PyTorch training on Kubernetes.

This package is the operator, its CLI and the embedded local cluster. ``railyard.protocol``
is the small torch-free, kopf-free module the bundled trainer (``railyard_trainer``) shares
with it. Importing ``railyard`` itself imports nothing heavy.
"""

__version__ = "0.1.0"
GROUP = "railyard.dev"
VERSION = "v1alpha1"
