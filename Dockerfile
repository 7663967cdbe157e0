# One image for every vistarl role; EXTRAS picks what gets installed, TORCH_INDEX which torch build.
#   docker build -t vistarl --build-arg TORCH_INDEX=<a CPU torch wheel index> .      # everything, CPU torch
#   docker build -t vistarl-env --build-arg EXTRAS=server .     # env servers only (every env, MCP): no torch
#   docker build -t vistarl:gpu --build-arg TORCH_INDEX=<a CUDA 12.8 torch wheel index> .
# Package sources are the builder's to give, never written here: TORCH_INDEX (PyTorch's wheel index for
# the torch build wanted, or a mirror of it) and PIP_INDEX_URL (a Python package index) have no default;
# without them pip uses its own default index, and torch comes as that index's default build. apt uses
# the sources of the base image.
# BASE_IMAGE is the official Python image; `make compose-test` swaps in one built from Debian packages
# where no image registry is reachable (docs/deploy.md, "The real compose test").
# Layers go from the slowest-changing to the fastest: system packages, torch, the dependencies read
# from pyproject.toml, then the sources, so a source change rebuilds only the last two layers (seconds).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

# EGL, libGL and Mesa's software rasteriser: the VSI env renders its rooms with OpenGL through EGL
# (docs/vsi.md); moderngl loads libGL.so.1 (libgl1) as well as libEGL.so.1 (libegl1), and Mesa's
# llvmpipe driver comes with libgl1-mesa-dri. Not pinned: Debian's security updates replace these
# versions in the archive, so a pin would break later builds.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends libegl1 libgl1 libgl1-mesa-dri \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 vistarl
WORKDIR /app

# Each argument is declared just before the first step that reads it: a value is part of the cache
# key of every step after its declaration.
ARG EXTRAS=server,train
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX
# torch first, from TORCH_INDEX when given (pip takes an empty index URL as none), so the `train` extra
# does not pull another torch build.
RUN case ",${EXTRAS}," in \
        *,train,*|*,all,*) PIP_INDEX_URL="${TORCH_INDEX:-}" pip install "torch==${TORCH_VERSION}" ;; \
    esac

# Where pip finds everything else (an argument is in the environment of the RUN steps after it; pip
# reads it there); `make compose-test` points it and TORCH_INDEX at a local index of the machine's own
# wheels.
ARG PIP_INDEX_URL
# The dependencies alone: an empty package with pyproject.toml's requirements (and a blank README),
# so this layer is rebuilt only when pyproject.toml changes. The build backend stays installed, so the
# sources below install without fetching it again.
COPY pyproject.toml ./
RUN touch README.md && pip install "setuptools>=77" "./[${EXTRAS}]" && pip uninstall -y vistarl && rm README.md

COPY README.md ./
COPY clients ./clients
COPY services ./services
COPY trainer ./trainer
COPY vistarl ./vistarl
COPY configs ./configs
RUN pip install --no-deps --no-build-isolation . && rm -rf build

RUN mkdir -p /app/runs && chown 1000:1000 /app/runs
USER 1000:1000
EXPOSE 8000
CMD ["vistarl", "serve", "sokoban", "--host", "0.0.0.0", "--port", "8000"]
