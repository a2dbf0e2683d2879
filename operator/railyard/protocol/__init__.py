"""What the operator and the trainer both speak: rank table, heartbeats, checkpoint manifest,
exit codes. Standard library only: the trainer imports this without kopf, kubernetes or pydantic,
and the operator imports it without torch."""
