"""The TrainingJob spec's cross-field rules, written once as CEL: the CRD carries them (the API
server enforces them) and :func:`railyard.api.validation.check_rules` evaluates the same rules
for ``railyard validate``."""

from __future__ import annotations

from railyard.protocol import trainerconfig as contract

#: ``spec.gang.schedulerName`` values of the gang schedulers that bring their own PodGroup
#: (Volcano, then the names scheduler-plugins installs under); railyard.logic.schedulers.
VOLCANO_SCHEDULER = "volcano"
COSCHEDULING_SCHEDULERS = ("scheduler-plugins-scheduler", "scheduler-plugins", "coscheduling")
GROUP_SCHEDULERS = (VOLCANO_SCHEDULER, *COSCHEDULING_SCHEDULERS)

#: Cross-field rules, written once as CEL (enforced by the API server through the CRD) and
#: mirrored in Python by :func:`railyard.api.validation.check_rules`. ``fieldPath`` is relative
#: to the spec.
SPEC_RULES: list[dict[str, str]] = [
    {
        "rule": "self.procsPerNode % self.parallelism.tensor == 0 || self.parallelism.tensor % self.procsPerNode == 0",
        "message": "parallelism.tensor must divide procsPerNode (a tensor-parallel group inside one node) or be a "
                   "multiple of it (a group spanning tensor / procsPerNode nodes of one NVLink domain, "
                   "topology.nvlinkLevel). Set tensor to a divisor or a multiple of procsPerNode.",
        "fieldPath": ".parallelism.tensor",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "(self.procsPerNode % self.parallelism.tensor != 0 && self.parallelism.tensor % self.procsPerNode != "
                "0) || (self.nodes * self.procsPerNode) % (self.parallelism.tensor * self.parallelism.pipeline) == 0",
        "message": "parallelism.tensor x parallelism.pipeline must divide the world size (nodes x procsPerNode).",
        "fieldPath": ".parallelism.pipeline",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.parallelism.data) || (self.nodes * self.procsPerNode) % (self.parallelism.tensor * "
                "self.parallelism.pipeline) != 0 || self.parallelism.tensor * self.parallelism.pipeline * "
                "self.parallelism.data == self.nodes * self.procsPerNode",
        "message": "parallelism.tensor x pipeline x data must equal nodes x procsPerNode. Leave data empty to derive "
                   "it.",
        "fieldPath": ".parallelism.data",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "has(self.trainer.program) || (self.nodes * self.procsPerNode) % (self.parallelism.tensor * "
                "self.parallelism.pipeline) != 0 || self.trainer.batchSize % ((self.nodes * self.procsPerNode) / "
                "(self.parallelism.tensor * self.parallelism.pipeline)) == 0",
        "message": "trainer.batchSize must be a multiple of the data-parallel degree (nodes x procsPerNode / (tensor "
                   "x pipeline)).",
        "fieldPath": ".trainer.batchSize",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.parallelism.pipeline == 1 || !has(self.parallelism.microbatches) || "
                "self.parallelism.microbatches >= self.parallelism.pipeline",
        "message": "parallelism.microbatches must be at least parallelism.pipeline so every stage has work.",
        "fieldPath": ".parallelism.microbatches",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.parallelism.pipelineSchedule != 'Interleaved1F1B' || self.parallelism.pipeline > 1",
        "message": "parallelism.pipelineSchedule Interleaved1F1B needs pipeline > 1.",
        "fieldPath": ".parallelism.pipelineSchedule",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "double(self.trainer.watchdogSeconds) < double(self.trainer.collectiveTimeoutSeconds)",
        "message": "trainer.watchdogSeconds must be below trainer.collectiveTimeoutSeconds, so a hung rank reports "
                   "itself before its peers time out.",
        "fieldPath": ".trainer.watchdogSeconds",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.trainer.program) || (has(self.trainer.program.script) ? 1 : 0) + "
                "(has(self.trainer.program.module) ? 1 : 0) + (has(self.trainer.program.command) ? 1 : 0) == 1",
        "message": "trainer.program must name exactly one of script (a Python file), module (python -m) or command "
                   "(an executable).",
        "fieldPath": ".trainer.program",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.topology.mode != 'Required' || has(self.topology.requiredLevel)",
        "message": "topology.requiredLevel must be set when topology.mode is Required (e.g. railyard.dev/spine).",
        "fieldPath": ".topology.requiredLevel",
        "reason": "FieldValueRequired",
    },
    {
        "rule": "!has(self.topology.levels) || !has(self.topology.requiredLevel) || self.topology.requiredLevel in "
                "self.topology.levels",
        "message": "topology.requiredLevel must be one of topology.levels.",
        "fieldPath": ".topology.requiredLevel",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.parallelism.dataReplicas <= 1 || (self.nodes * self.procsPerNode) % (self.parallelism.tensor * "
                "self.parallelism.pipeline) != 0 || ((self.nodes * self.procsPerNode) / (self.parallelism.tensor * "
                "self.parallelism.pipeline)) % self.parallelism.dataReplicas == 0",
        "message": "parallelism.dataReplicas must divide the data-parallel degree (nodes x procsPerNode / (tensor x "
                   "pipeline)).",
        "fieldPath": ".parallelism.dataReplicas",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.faultTolerance.mode == 'None' || self.parallelism.dataReplicas != 1",
        "message": "faultTolerance.mode ReplicaGroups needs parallelism.dataReplicas > 1: the replica groups are the "
                   "units that fail alone. Set dataReplicas (HSDP), 0 to let the operator choose, or use mode None.",
        "fieldPath": ".faultTolerance.mode",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.faultTolerance.mode == 'None' || self.parallelism.dataReplicas == 0 || "
                "self.nodes % self.parallelism.dataReplicas == 0",
        "message": "faultTolerance.mode ReplicaGroups needs nodes to be a multiple of parallelism.dataReplicas: every "
                   "replica group is nodes / dataReplicas whole pods (a pod never holds ranks of two groups).",
        "fieldPath": ".nodes",
        "reason": "FieldValueInvalid",
    },
    dict(contract.MIN_REPLICAS_RULE),  # the trainer checks the same rule (protocol/trainerconfig.py)
    {
        "rule": "self.parallelism.dataReplicas != 0 || self.faultTolerance.mode == 'ReplicaGroups'",
        "message": "parallelism.dataReplicas 0 (the operator chooses the number of replica groups) needs "
                   "faultTolerance.mode ReplicaGroups; set dataReplicas to 1 (plain FSDP) or a number of HSDP "
                   "replicas.",
        "fieldPath": ".parallelism.dataReplicas",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.faultTolerance.mode == 'ReplicaGroups' || !has(self.faultTolerance.healNetwork) || "
                "(!has(self.faultTolerance.healNetwork.interface) && !has(self.faultTolerance.healNetwork.attachment))",
        "message": "faultTolerance.healNetwork names the network a restarted replica group heals over: it needs "
                   "faultTolerance.mode ReplicaGroups. Set the mode, or remove healNetwork.",
        "fieldPath": ".faultTolerance.healNetwork",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "self.trainer.dataset.type == 'synthetic' || has(self.trainer.dataset.path)",
        "message": "trainer.dataset.path is required when trainer.dataset.type is files or tokens.",
        "fieldPath": ".trainer.dataset.path",
        "reason": "FieldValueRequired",
    },
    {
        "rule": "self.gang.scheduler != 'kubernetes' || (!has(self.gang.queueName) && (!has(self.gang.schedulerName) "
                "|| !(self.gang.schedulerName in "
        + "["
        + ", ".join(f"'{n}'" for n in GROUP_SCHEDULERS)
        + "])))",
        "message": "gang.scheduler kubernetes cannot be combined with gang.queueName or a Volcano or "
                   "scheduler-plugins gang.schedulerName: each of them schedules the gang. Set gang.scheduler to auto "
                   "or none, or remove the other.",
        "fieldPath": ".gang.scheduler",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.gpuClaim) || !has(self.gpusPerPod) || self.gpusPerPod > 0",
        "message": "gpuClaim needs GPUs: gpusPerPod 0 claims none. Set gpusPerPod to at least procsPerNode (or leave "
                   "it empty), or remove gpuClaim for a CPU-only job.",
        "fieldPath": ".gpuClaim",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.gpuClaim) || !has(self.resources) || ((!has(self.resources.limits) || !('nvidia.com/gpu' "
                "in self.resources.limits)) && (!has(self.resources.requests) || !('nvidia.com/gpu' in "
                "self.resources.requests)))",
        "message": "gpuClaim asks for the GPUs by Dynamic Resource Allocation: remove nvidia.com/gpu from "
                   "resources.limits and resources.requests (the count is gpusPerPod), or remove gpuClaim to use the "
                   "extended resource.",
        "fieldPath": ".gpuClaim",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.gpusPerPod) || self.gpusPerPod == 0 || self.gpusPerPod >= self.procsPerNode",
        "message": "gpusPerPod must be 0 (CPU) or at least procsPerNode (one GPU per process).",
        "fieldPath": ".gpusPerPod",
        "reason": "FieldValueInvalid",
    },
]
