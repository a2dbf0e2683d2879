#!/usr/bin/env bash
# Download the wheels bench/gpu/run.sh needs on a GPU machine without a package registry, into
# .gpu-wheels/ (ignored by git; a run carries it: `carry: [".gpu-wheels"]`). Python 3.12,
# x86_64 Linux; --no-deps and exact pins, so nothing here can pull a torch: the machine's own
# torch is used. About 17 MB (numpy is 15 of it). See bench/gpu/README.md.
#
#   bash bench/gpu/fetch-wheels.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/.gpu-wheels}
mkdir -p "$dest"
# The trainer's own imports beyond torch (tokenizers and safetensors are only for
# `railyard-train prepare` and `export`, which the run does not use).
trainer=(numpy==2.5.5 xxhash==4.1.0)
# TorchTitan 0.2.2 (the release for torch 2.10/2.11) and what its model, parallelize_llama and
# config import; datasets (pyarrow) and tensorboard are stubbed in bench/gpu/titan.py instead.
titan=(torchtitan==0.2.2 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1 typing-extensions==4.16.0
       torchdata==0.11.0 einops==0.8.2)
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$dest" "${trainer[@]}" "${titan[@]}"
ls -l "$dest"
du -sh "$dest"
