"""Kubernetes' ``$(VAR)`` expansion of container arguments, written once.

The kubelet expands ``$(VAR)`` in a container's ``command`` and ``args`` from its environment;
the local cluster's node agent does the same for the pods it runs, and ``railyard-train`` does
it for ``spec.trainer.program`` (whose arguments travel in config.json, where no kubelet sees
them), so a program's arguments can name the pod's folders (``$(RAILYARD_CHECKPOINT_SHARED_DIR)``).
Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are replaced, ``$$`` is a literal ``$``,
    unknown names are left as they are."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "$" and i + 1 < n:
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    if name in env:
                        out.append(env[name])
                    else:
                        out.append(text[i : end + 1])
                    i = end + 1
                    continue
        out.append(ch)
        i += 1
    return "".join(out)
