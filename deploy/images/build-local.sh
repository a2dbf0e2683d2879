#!/usr/bin/env bash
# Build both Railyard images on a machine that reaches Debian's mirror and PyPI but no container
# registry (CI, an air-gapped build host with a package proxy).
#
#   deploy/images/build-local.sh            # base image (cached), then both images in parallel
#   deploy/images/build-local.sh --base     # only the base image; prints its tag
#
# 1. The base image: Debian bookworm from Debian's own packages (debootstrap, minbase, plus
#    python3, python3-venv, ca-certificates; `python` -> `python3`), with this host's CA bundle so
#    pip inside a build trusts the same roots (a TLS-intercepting proxy) as the host. Loaded with
#    `docker import` as railyard-local/python:bookworm-<key>, <key> a hash of everything that
#    goes into it (this recipe, the mirror, the CA bundle). A tag already in Docker, or a tarball
#    in the cache folder, is reused; otherwise it is made from scratch (about a minute).
# 2. The torch wheel for the trainer: `pip download --no-deps torch==<TORCH_VERSION>` into
#    deploy/images/wheels/ (git-ignored; on this kind of machine pip serves the CPU wheel from
#    local disk), handed to the build as TORCH_WHEEL. Real builds leave TORCH_WHEEL empty and get
#    torch from the CUDA index (trainer_image/Dockerfile).
# 3. Both Dockerfiles, unchanged, with build arguments only: PYTHON_IMAGE / BASE_IMAGE (the base
#    above), SOURCE_DATE_EPOCH (the last commit), TORCH_WHEEL.
#
# Environment (all optional):
#   RAILYARD_OPERATOR_IMAGE  tag of the operator image   (default railyard-operator:local)
#   RAILYARD_TRAINER_IMAGE   tag of the trainer image    (default railyard-trainer:local-cpu)
#   RAILYARD_IMAGE_CACHE     cache folder for the base tarball (default ~/.cache/railyard/images)
#   DEBIAN_MIRROR            (default http://deb.debian.org/debian)
#   CA_BUNDLE                PEM bundle copied into the base (default /etc/ssl/certs/ca-certificates.crt)
#   DOCKER                   docker CLI (default: docker)
#   PYTHON                   Python with pip for the wheel download (default: python, else python3)
# Needs: root (debootstrap), debootstrap, a running Docker engine.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DOCKER=${DOCKER:-docker}
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
CACHE=${RAILYARD_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/railyard/images}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
OPERATOR_IMAGE=${RAILYARD_OPERATOR_IMAGE:-railyard-operator:local}
TRAINER_IMAGE=${RAILYARD_TRAINER_IMAGE:-railyard-trainer:local-cpu}
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates
# Bump when the recipe below changes in a way the other inputs do not show.
RECIPE=3

log() { printf '[build-local %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

base_key() {
    { printf '%s\n' "$RECIPE" "$SUITE" "$MIRROR" "$PACKAGES"; cat "$CA_BUNDLE"; } | sha256sum | cut -c1-16
}

make_base() {
    [ -r "$CA_BUNDLE" ] || die "CA bundle $CA_BUNDLE not readable (set CA_BUNDLE)"
    local key tag tarball
    key=$(base_key)
    tag="railyard-local/python:$SUITE-$key"
    tarball="$CACHE/base-$SUITE-$key.tar"
    if "$DOCKER" image inspect "$tag" >/dev/null 2>&1; then
        log "base image $tag: already in Docker"
    else
        if [ -f "$tarball" ]; then
            log "base image $tag: from the cached $tarball"
        else
            command -v debootstrap >/dev/null || die "debootstrap not found (apt-get install -y debootstrap)"
            [ "$(id -u)" = 0 ] || die "debootstrap needs root"
            local t0=$SECONDS root
            root=$(mktemp -d "${TMPDIR:-/tmp}/railyard-base.XXXXXX")
            # shellcheck disable=SC2064  # expand now: the trap must remove this folder
            trap "rm -rf '$root'" EXIT
            log "base image $tag: debootstrap $SUITE ($PACKAGES) from $MIRROR"
            debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" \
                >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; die "debootstrap failed (log above)"; }
            rm -f "$root.log"
            # What a container never needs: package caches and lists, docs, man pages, locales.
            rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
                "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/info "$root"/usr/share/locale \
                "$root"/var/log/* "$root"/tmp/* "$root"/root/.cache
            ln -sf python3 "$root/usr/bin/python"
            # The host's roots, also for pip (which otherwise trusts only its own certifi copy).
            cp "$CA_BUNDLE" "$root/etc/ssl/certs/ca-certificates.crt"
            printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"
            mkdir -p "$CACHE"
            tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
            mv "$tarball.tmp" "$tarball"
            rm -rf "$root"
            trap - EXIT
            log "base image $tag: made in $((SECONDS - t0)) s ($(du -h "$tarball" | cut -f1))"
        fi
        "$DOCKER" import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --change 'CMD ["python3"]' \
            "$tarball" "$tag" >/dev/null
    fi
    BASE_IMAGE=$tag
}

torch_wheel() {
    local version dir
    version=$(sed -n 's/^ARG TORCH_VERSION=//p' "$ROOT/trainer_image/Dockerfile")
    [ -n "$version" ] || die "no ARG TORCH_VERSION in trainer_image/Dockerfile"
    dir="$ROOT/deploy/images/wheels"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: "torch==$version" -d "$dir" >&2 \
        || die "pip download torch==$version failed"
    # pip may leave wheels of other versions from earlier runs: take this version's.
    TORCH_WHEEL=$(cd "$dir" && ls -1 "torch-$version"[+-]*.whl 2>/dev/null | head -1)
    [ -n "$TORCH_WHEEL" ] || die "no torch-$version wheel in $dir"
}

build() {  # build NAME LOGFILE docker-build-args...
    local name=$1 logfile=$2 t0=$SECONDS
    shift 2
    if "$DOCKER" build --force-rm "$@" >"$logfile" 2>&1; then
        log "$name: built in $((SECONDS - t0)) s"
    else
        tail -40 "$logfile" >&2
        log "$name: build failed after $((SECONDS - t0)) s (log above, full log $logfile)"
        return 1
    fi
}

main() {
    "$DOCKER" info >/dev/null 2>&1 || die "no Docker engine reachable with '$DOCKER' (start dockerd)"
    make_base
    if [ "${1:-}" = "--base" ]; then
        echo "$BASE_IMAGE"
        return
    fi
    torch_wheel
    local epoch logs status=0
    epoch=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)
    logs=$(mktemp -d "${TMPDIR:-/tmp}/railyard-build-logs.XXXXXX")
    log "building $OPERATOR_IMAGE and $TRAINER_IMAGE (torch from $TORCH_WHEEL) on $BASE_IMAGE"
    build "$OPERATOR_IMAGE" "$logs/operator.log" -f "$ROOT/Dockerfile" -t "$OPERATOR_IMAGE" \
        --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "SOURCE_DATE_EPOCH=$epoch" "$ROOT" &
    local op=$!
    build "$TRAINER_IMAGE" "$logs/trainer.log" -f "$ROOT/trainer_image/Dockerfile" -t "$TRAINER_IMAGE" \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "SOURCE_DATE_EPOCH=$epoch" \
        --build-arg "TORCH_WHEEL=$TORCH_WHEEL" "$ROOT" &
    local tr=$!
    wait "$op" || status=1
    wait "$tr" || status=1
    [ "$status" = 0 ] || die "image build failed"
    rm -rf "$logs"
    echo "$OPERATOR_IMAGE"
    echo "$TRAINER_IMAGE"
}

main "$@"
