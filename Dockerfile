# The Railyard operator image: the operator, its CLI and the heartbeat endpoint. No torch.
# Build:  docker build -t ghcr.io/railyard-dev/railyard-operator:0.1.0 .
# kind:   kind load docker-image ghcr.io/railyard-dev/railyard-operator:0.1.0
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 SOURCE_DATE_EPOCH=0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY trainer_image/ trainer_image/
RUN python -m venv /opt/railyard \
 && /opt/railyard/bin/pip install --no-compile . \
 && find /opt/railyard -name '__pycache__' -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="railyard-operator" \
      org.opencontainers.image.source="https://github.com/railyard-dev/railyard" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/railyard /opt/railyard
ENV PATH=/opt/railyard/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Non-root, numeric so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["railyard"]
CMD ["operator", "run", "--all-namespaces"]
