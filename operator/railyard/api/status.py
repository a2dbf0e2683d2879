"""The TrainingJob's status: what ``kubectl get`` and ``kubectl describe`` show, written only by
the operator (the status subresource)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from railyard.api.base import ApiModel


class Condition(ApiModel):
    type: Annotated[
        str,
        Field(
            description="Admitted (Kueue admitted the job's Workload; False with Kueue's reason while Queued), "
                        "Placed, GangReady, Running, Restarting, Degraded, Blind (Running pods the operator has heard "
                        "nothing from: no heartbeat, no launcher report), Succeeded, Failed or Suspended."
        ),
    ]
    status: Annotated[Literal["True", "False", "Unknown"], Field(description="True, False or Unknown.")]
    reason: Annotated[str, Field(description="CamelCase reason.")] = ""
    message: Annotated[str, Field(description="Human-readable detail.")] = ""
    last_transition_time: Annotated[str | None, Field(description="RFC 3339 time of the last status change.")] = None
    observed_generation: Annotated[int | None, Field(description="Generation the condition was set for.")] = None


class PlacementStatus(ApiModel):
    attempt: Annotated[
        int,
        Field(
            description="The attempt this placement was made for (status.attempt moves on at a restart before the "
                        "next gang is placed)."
        ),
    ] = 0
    moved: Annotated[
        list[int],
        Field(description="Pod indices whose node changed from the previous attempt (sticky re-placement), first 64."),
    ] = []
    nodes: Annotated[
        list[str], Field(description="Nodes of the gang by pod index (first 64 shown for large gangs).")
    ] = []
    node_count: Annotated[int, Field(description="Number of nodes in the gang.")] = 0
    spares: Annotated[list[str], Field(description="Hot spare nodes held for the gang.")] = []
    domains: Annotated[dict[str, int], Field(description="Domains spanned per topology level.")] = {}
    cross_bytes_per_step: Annotated[
        dict[str, float], Field(description="Bytes per training step crossing each topology level.")
    ] = {}
    rail_aligned: Annotated[bool, Field(description="Every data-parallel group is on a single rail.")] = False
    summary: Annotated[str, Field(description="One-line summary.")] = ""


class CheckpointRef(ApiModel):
    step: Annotated[int, Field(description="Training step of the checkpoint.")]
    tier: Annotated[str, Field(description="memory, local or shared.")]
    time: Annotated[str | None, Field(description="RFC 3339 time it was committed.")] = None


class CheckpointFence(ApiModel):
    step: Annotated[int, Field(description="No checkpoint newer than this step written before `attempt` is restored.")]
    attempt: Annotated[
        int,
        Field(
            description="The attempt that restarted from at most `step`; its checkpoints and later attempts' are on "
                        "the run's timeline again."
        ),
    ]


class Restarts(ApiModel):
    total: Annotated[
        int, Field(description="All restarts after failures (planned moves are counted apart, in planned).")
    ] = 0
    infrastructure: Annotated[int, Field(description="Restarts after infrastructure failures.")] = 0
    application: Annotated[int, Field(description="Restarts after application failures.")] = 0
    sdc: Annotated[int, Field(description="Restarts after silent data corruption.")] = 0
    straggler: Annotated[int, Field(description="Restarts after hangs or stragglers.")] = 0
    planned: Annotated[
        int,
        Field(
            description="Planned moves: the gang's pods moved off nodes announced to go (cordoned, tainted by someone "
                        "else, maintenance announced), ahead of time. Not a failure: no restart budget is spent, the "
                        "streak is not extended."
        ),
    ] = 0
    last_reason: Annotated[str, Field(description="Why the last restart happened.")] = ""
    last_time: Annotated[str | None, Field(description="When the last restart happened.")] = None
    streak: Annotated[
        dict[str, int] | None,
        Field(
            description="Restarts per class since the gang last ran healthy for restartPolicy.resetAfterSeconds; "
                        "budgets and backoff count these (absent: the totals above)."
        ),
    ] = None


class StragglerStatus(ApiModel):
    rank: Annotated[int, Field(description="Global rank.")]
    node: Annotated[str, Field(description="Node of the rank.")]
    score: Annotated[float, Field(description="Peers' median compute time over this rank's (1.0 = typical).")]
    since: Annotated[str | None, Field(description="When it was first flagged.")] = None


class QuarantinedNode(ApiModel):
    node: Annotated[str, Field(description="Node name.")]
    reason: Annotated[str, Field(description="Why it was quarantined.")]
    time: Annotated[str | None, Field(description="When.")] = None


class RestoreStatus(ApiModel):
    tier: Annotated[
        str,
        Field(description="Tier the attempt restored from (empty: fresh start; peer: faultTolerance ReplicaGroups, a "
                          "restarted group healed from a live one)."),
    ] = ""
    step: Annotated[int, Field(description="Step restored.")] = -1
    steps_lost: Annotated[int, Field(description="Steps trained before the failure that were lost.")] = 0


class LastRestart(ApiModel):
    attempt: Annotated[int, Field(description="The attempt this restart started.")] = 0
    mode: Annotated[
        Literal["InPlace", "Full"],
        Field(
            description="InPlace: pods on healthy nodes kept, only the others replaced; Full: the whole gang recreated."
        ),
    ] = "Full"
    state: Annotated[
        Literal["Pending", "Started", "Done", "Waiting"],
        Field(
            description="Pending: waiting for backoff and the replacements' placement; Started: replacements created, "
                        "launchers told; Done: every pod runs the attempt. Waiting (faultTolerance ReplicaGroups): "
                        "the replica groups in waitingGroups found no node; the others train on, and the waiting ones "
                        "are placed and started (a new attempt) once a node is usable."
        ),
    ] = "Pending"
    reason: Annotated[
        str,
        Field(
            description="For a Full restart after an in-place one was wanted: why (InPlaceDisabled, SpecChanged, "
                        "NoControlChannel, NothingToKeep, NotPlaceable, RestartNotAnswered). For an in-place one: "
                        "ReplicaGroupReplaced when only the replica groups the failure touched restarted "
                        "(faultTolerance ReplicaGroups)."
        ),
    ] = ""
    message: Annotated[str, Field(description="Which pods stayed, which moved where, and why.")] = ""
    kept: Annotated[int, Field(description="Pods kept on their nodes.")] = 0
    replaced: Annotated[list[int], Field(description="Pod indices replaced (first 64).")] = []
    carried_on: Annotated[
        list[int],
        Field(
            description="faultTolerance ReplicaGroups (reason ReplicaGroupReplaced): pod indices of the replica "
                        "groups the failure did not touch, whose workers carried on untouched (never told to restart)."
        ),
    ] = []
    waiting_groups: Annotated[
        list[int],
        Field(
            description="faultTolerance ReplicaGroups, state Waiting: the replica groups that wait for a node while "
                        "the others train."
        ),
    ] = []
    started_time: Annotated[str | None, Field(description="When the kept launchers were told to restart.")] = None


class LastFailure(ApiModel):
    attempt: Annotated[int, Field(description="The attempt that failed.")] = 0
    reason: Annotated[
        str,
        Field(
            description="The failure's kind (the Restarting or Failed condition's reason), e.g. ApplicationExitCode, "
                        "NodeNotReady, HangVerdict."
        ),
    ] = ""
    pod: Annotated[
        str, Field(description="The first failing pod (empty when no pod is to blame, e.g. a hang verdict).")
    ] = ""
    pod_index: Annotated[int | None, Field(description="That pod's index in the gang.")] = None
    node: Annotated[str, Field(description="The node it ran on.")] = ""
    exit_code: Annotated[
        int | None, Field(description="Exit code of its trainer container (empty when it had not exited).")
    ] = None
    message: Annotated[
        str,
        Field(
            description="The tail of its termination message: what the trainer wrote to /dev/termination-log, else "
                        "the last lines of its log (terminationMessagePolicy FallbackToLogsOnError). Kept across "
                        "restarts, when the pod itself is gone."
        ),
    ] = ""
    time: Annotated[str | None, Field(description="When the operator saw the failure.")] = None


class TrainingJobStatus(ApiModel):
    model_config = ConfigDict(extra="ignore")

    phase: Annotated[
        Literal[
            "Pending", "Queued", "Placing", "Starting", "Running", "Restarting", "Suspended", "Succeeded", "Failed"
        ],
        Field(
            description="Pending, Queued (waiting for Kueue to admit its Workload: no pod exists), Placing, Starting, "
                        "Running, Restarting, Suspended, Succeeded or Failed."
        ),
    ] = "Pending"
    conditions: Annotated[list[Condition], Field(description="Kubernetes-style conditions.")] = []
    observed_generation: Annotated[int, Field(description="The spec generation this status reflects.")] = 0
    attempt: Annotated[int, Field(description="Current attempt (0 for the first gang, +1 per restart).")] = 0
    replica_groups: Annotated[int, Field(
        description="faultTolerance ReplicaGroups with parallelism.dataReplicas 0: the number of replica groups the "
                    "operator chose for the job (kept for its life; 0: not chosen).")] = 0
    message: Annotated[str, Field(description="What is happening now, for a person.")] = ""
    placement: Annotated[PlacementStatus | None, Field(description="Where the gang runs.")] = None
    step: Annotated[int, Field(description="Newest training step reported by the gang.")] = 0
    loss: Annotated[float | None, Field(description="Newest loss.")] = None
    tokens_per_second: Annotated[float, Field(description="Training throughput of the whole gang.")] = 0.0
    last_checkpoint: Annotated[
        CheckpointRef | None, Field(description="Newest verified checkpoint over all tiers.")
    ] = None
    checkpoints: Annotated[list[CheckpointRef], Field(description="Newest verified checkpoint per tier.")] = []
    checkpoint_fence: Annotated[
        CheckpointFence | None,
        Field(
            description="faultTolerance ReplicaGroups: the replica groups' states differed after `step` and no "
                        "majority named the bad one, so the run went back to at most that step; the checkpoints the "
                        "earlier attempts wrote after it are never restored (every restart's hint says so)."
        ),
    ] = None
    restore: Annotated[RestoreStatus | None, Field(description="What the current attempt resumed from.")] = None
    restarts: Annotated[Restarts, Field(description="Restarts by failure class.")] = Restarts()
    stragglers: Annotated[list[StragglerStatus], Field(description="Ranks currently flagged as stragglers.")] = []
    quarantined_nodes: Annotated[list[QuarantinedNode], Field(description="Nodes this job quarantined.")] = []
    pending_spec_changes: Annotated[str, Field(description="Spec changes that take effect at the next restart.")] = ""
    start_time: Annotated[str | None, Field(description="When the first gang started running.")] = None
    completion_time: Annotated[str | None, Field(description="When the job succeeded or failed.")] = None
    time_to_all_ready_seconds: Annotated[
        float | None, Field(description="Seconds from gang creation to all pods Running in the current attempt.")
    ] = None
    gang_created_time: Annotated[
        str | None,
        Field(description="When the current attempt's pods were created (the gang schedule timeout counts from here)."),
    ] = None
    failure_time: Annotated[
        str | None, Field(description="When the failure that ended the previous attempt was detected.")
    ] = None
    next_attempt_time: Annotated[
        str | None, Field(description="Restart backoff: the next gang is not placed before this time.")
    ] = None
    pods_since_attempt: Annotated[
        int | None,
        Field(
            description="The attempt of the last full gang creation: the current attempt's pods are, per pod index, "
                        "the newest pod created since then (in-place restarts keep pods of earlier attempts). Empty: "
                        "the current attempt."
        ),
    ] = None
    last_restart: Annotated[
        LastRestart | None, Field(description="How the current attempt was started from the previous one.")
    ] = None
    spares_held: Annotated[
        int, Field(description="Hot spare nodes held by a placeholder pod (gang.hotSpares wanted).")
    ] = 0
    last_failure: Annotated[
        LastFailure | None,
        Field(
            description="The failure that ended the last failed attempt: its first failing pod, node, exit code and "
                        "last words."
        ),
    ] = None
