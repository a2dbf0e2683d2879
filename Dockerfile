# The Railyard operator image: the operator, its CLI and the heartbeat endpoint. No torch.
#
# Build (reproducible: same commit + same base image -> same layers):
#   docker buildx build --build-arg SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) \
#     --output type=docker,rewrite-timestamp=true -t railyard-operator:0.1.0 .
# kind:
#   kind load docker-image railyard-operator:0.1.0
# See docs/deploy.md.
#
# The base image is pinned by version; pin it by digest too for a fully fixed input:
#   --build-arg PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG SOURCE_DATE_EPOCH=0
ENV SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Dependencies first, at the exact versions the tests ran with (cached across source edits).
COPY deploy/images/operator-constraints.txt /src/constraints.txt
RUN python -m venv /opt/railyard \
 && /opt/railyard/bin/pip install --no-compile -r /src/constraints.txt
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY trainer_image/railyard_trainer/ trainer_image/railyard_trainer/
# The operator never carries torch (pyproject keeps it in the [trainer] extra): fail the build if
# a dependency ever pulls it in.
RUN /opt/railyard/bin/pip install --no-compile --no-deps -c /src/constraints.txt . \
 && /opt/railyard/bin/python -c "import importlib.util, sys; sys.exit('torch in the operator image' if importlib.util.find_spec('torch') else 0)" \
 && /opt/railyard/bin/railyard --help >/dev/null
# Byte-code with hash-based invalidation: deterministic (no source mtimes inside .pyc files).
RUN find /opt/railyard -name '__pycache__' -prune -exec rm -rf {} + \
 && /opt/railyard/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/railyard/lib \
 && find /opt/railyard -exec touch -h -d "@${SOURCE_DATE_EPOCH}" {} +

FROM ${PYTHON_IMAGE}
ARG SOURCE_DATE_EPOCH=0
LABEL org.opencontainers.image.title="railyard-operator" \
      org.opencontainers.image.description="Railyard operator: rail-aware, failure-tolerant PyTorch training on Kubernetes" \
      org.opencontainers.image.source="https://github.com/railyard-dev/railyard" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/railyard /opt/railyard
ENV PATH=/opt/railyard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root and numeric, so the kubelet can verify runAsNonRoot; nothing is written outside /tmp
# (the chart mounts an emptyDir there and makes the root filesystem read-only).
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["railyard"]
CMD ["operator", "run", "--all-namespaces"]
