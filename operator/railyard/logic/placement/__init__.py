"""Rail-aware gang placement (being split by seams, issue 45)."""

from railyard.logic.placement.fresh import (
    CONDITION_REASONS,
    GangRequest,
    GroupPlacement,
    Mode,
    Placement,
    PlacementInput,
    PreviousPlacement,
    Unplaceable,
    build_gang_request,
    build_placement_input,
    job_tolerations,
    matches_node_selector,
    plan_placement,
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
    "job_tolerations",
    "matches_node_selector",
    "plan_placement",
]
