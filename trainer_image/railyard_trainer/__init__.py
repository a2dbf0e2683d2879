"""The bundled Railyard trainer: FSDP2 + tensor parallel + pipeline parallel on one DeviceMesh.

Never imports kopf or kubernetes. Shares only ``railyard.protocol`` (rank table, heartbeats,
checkpoint manifest, exit codes) with the operator.
"""
