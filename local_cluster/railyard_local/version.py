"""The Kubernetes version the local cluster is: what the embedded API server serves (``/version``)
and what its nodes' kubelets report (``status.nodeInfo.kubeletVersion``), one constant so that the
two never disagree. v1.36: the version of the real control plane whose answers tests/golden
replays, and the first that serves the gang scheduling API the operator uses."""

KUBERNETES_VERSION = "v1.36.2"
#: How the local cluster's pieces say they are ours (semver build metadata, as distributions do).
LOCAL_BUILD = "railyard"


def version_parts(version: str = KUBERNETES_VERSION) -> tuple[str, str]:
    """("1", "36") of "v1.36.2": the major and minor fields of ``/version``."""
    major, minor = version.lstrip("v").split(".")[:2]
    return major, minor
