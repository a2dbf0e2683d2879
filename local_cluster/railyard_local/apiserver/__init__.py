"""The embedded Kubernetes-compatible API server of ``railyard local``.

One Python process, loopback only, bearer-token auth, objects in SQLite (WAL) under a state
directory so that every acknowledged write survives SIGKILL and restart. It serves what kopf,
kubectl, Helm and our operator use: discovery (aggregated too) and OpenAPI, CRDs checked as
kube-apiserver checks them (structural schema, defaults, CEL compilation and cost) with
schema/CEL validation and defaults, status subresources, list/watch with selectors and
bookmarks, the three patch types and server-side apply with managedFields, the admission a
default cluster runs (service-account volume, tolerations, priority, Pod Security), finalizers,
garbage collection, namespaces, Table output, Events, Leases, the Pod subresources binding,
eviction (with PodDisruptionBudgets) and log, and the kube-controller-manager controllers a
cluster's users see act (disruption, taint-based eviction, resourceclaim, cordon taints).
tests/golden replays a real kube-apiserver's answers against it. See
docs/local-apiserver.md.

Command line::

    python -m railyard_local.apiserver --state-dir DIR --token TOKEN [--port 0] [--ready-file F]

In-process::

    server = APIServer(state_dir, token="secret")      # port=0 picks a free port
    url = await server.start()                           # "http://127.0.0.1:PORT"
    ...
    await server.stop()

or ``await serve(state_dir, token=..., ready_file=..., stop=asyncio.Event())``, or as a child
process with ``process.start_server_process(state_dir)`` (returns url, token, CA file; ``stop()``
is SIGTERM, ``kill()`` SIGKILL; ``write_kubeconfig(path)``). The server speaks HTTPS with a CA
kept under ``<state-dir>/pki`` (kubectl sends bearer tokens only over TLS).

``envtest.start_envtest(assets, work_dir)`` starts a real kube-apiserver and etcd instead.

Pod logs are served by ``server.log_provider(pod, container, previous) -> Path | None``; the
default reads ``<state-dir>/pods/<namespace>/<pod>/<container>.log`` (``.previous.log`` for the
previous run).
"""

from .server import APIServer, LogProvider, default_log_provider, serve

__all__ = ["APIServer", "LogProvider", "default_log_provider", "serve"]
