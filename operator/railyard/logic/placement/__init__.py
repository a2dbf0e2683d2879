"""Rail-aware gang placement: choose every node of the gang at once, or say why not.

Policy (issue 4, docs/placement.md):

- All or nothing: the gang's pods plus its hot spares all get a node, or the answer is
  :class:`Unplaceable` naming the constraint, how many nodes are short and where.
- ``Required`` with a level: the whole gang plus spares fits inside one domain of that level
  (best fit: the fullest domain that still fits), as Kueue's podset-required-topology does.
  ``Preferred`` tries the same and falls back to the whole cluster.
- Blocks: with a rail-pure layout (see :mod:`railyard.logic.layout`) the pods form blocks of
  ``dp`` pods that each host whole data-parallel groups. Blocks are packed so that each lies in
  the fewest leaf domains: in one leaf when it fits in one (``dp <= leaf size``), else in whole
  leaves of one domain of the deepest level that can hold it. If aligned capacity runs out, pods
  are placed node by node and blocks cut across leaves as well as possible (reported).
- Best fit at every level: fill the most-used domains that still fit, whole domains stay free;
  inside a leaf prefer partially used nodes with just enough free GPUs.
- Sticky re-placement: keep every healthy node of the previous placement with the same pod
  index (hence the same ranks); replace only failed, quarantined or otherwise unusable ones,
  preferring the gang's spares, and among those the ones sharing the deepest domain.

One entry point, one input: :func:`build_placement_input` makes a :class:`PlacementInput` from a
TrainingJob and the cluster (Node and Pod dicts: nodeSelector, tolerations, readiness, cordons,
quarantine marks, GPUs in use, the previous attempt's nodes and hot spares, the nodes that
failed), and :func:`plan_placement` decides from it. The operator (handlers/reconcile.py),
``railyard plan`` and ``railyard simulate`` all call these two, so they show the same answer.

One module per seam: :mod:`.types` (request, input, answer), :mod:`.tree` (the tree planner),
:mod:`.fresh` (a fresh placement), :mod:`.sticky` (sticky re-placement), :mod:`.plan` (the
decision between them) and :mod:`.job` (the TrainingJob adapter). Every name is importable from
this package, as it was from the one module it was split from.
"""

from __future__ import annotations

from railyard.logic.placement.job import (
    build_gang_request,
    build_placement_input,
    job_tolerations,
    matches_node_selector,
)
from railyard.logic.placement.plan import (
    plan_placement,
)
from railyard.logic.placement.types import (
    CONDITION_REASONS,
    GangRequest,
    GroupPlacement,
    Mode,
    Placement,
    PlacementInput,
    PreviousPlacement,
    Unplaceable,
    compute_shared_domains,
)

__all__ = [
    "CONDITION_REASONS",
    "GangRequest",
    "GroupPlacement",
    "Mode",
    "Placement",
    "PlacementInput",
    "PreviousPlacement",
    "Unplaceable",
    "build_gang_request",
    "build_placement_input",
    "compute_shared_domains",
    "job_tolerations",
    "matches_node_selector",
    "plan_placement",
]
