"""The trainer's last words: where a pod's trainer writes its termination message.

Kubernetes gives each container a file (``terminationMessagePath``, by default
``/dev/termination-log``) whose content becomes ``state.terminated.message`` when the container
exits. The operator names it in the pod (the container's ``terminationMessagePath`` and
``RAILYARD_TERMINATION_LOG``); the trainer's launcher writes there, when it exits non-zero, which
rank failed first and the tail of that rank's error. The operator copies it into the job's
status and Events (railyard.logic.failure_report), so it outlives the pod.
"""

from __future__ import annotations

from railyard.protocol import podenv

#: The container's termination message file (Kubernetes' default ``terminationMessagePath``).
TERMINATION_LOG = "/dev/termination-log"
#: Environment variable naming that file for the trainer (unset: the trainer writes none).
TERMINATION_LOG_ENV = podenv.TERMINATION_LOG.name
#: The kubelet keeps at most this many bytes of a termination message file.
MAX_TERMINATION_MESSAGE_BYTES = 4096
