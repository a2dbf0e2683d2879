"""Names of the pod environment variables that the operator sets and the trainer reads, written
once for both sides (the older ``RAILYARD_*`` names are still spelled where they are used; new
ones belong here)."""

from __future__ import annotations

#: faultTolerance ReplicaGroups: this pod's replica group (its replica id in the quorum).
REPLICA_GROUP_ENV = "RAILYARD_REPLICA_GROUP"
#: faultTolerance ReplicaGroups: the job's Lighthouse, ``http://HOST:PORT`` (torchft's own name).
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
#: faultTolerance ReplicaGroups: the pod's IP (``status.podIP``), which the group's torchft
#: Manager advertises to the Lighthouse and to healing peers instead of the pod's short hostname.
POD_IP_ENV = "RAILYARD_POD_IP"
