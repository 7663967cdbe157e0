# One image for every vistarl role; EXTRAS picks what gets installed, TORCH_INDEX which torch build.
#   docker build -t vistarl .                                   # everything, CPU torch
#   docker build -t vistarl-env --build-arg EXTRAS=server .     # env servers only (every env, MCP): no torch
#   docker build -t vistarl:gpu --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
FROM python:3.11-slim

ARG EXTRAS=server,train
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

# EGL and Mesa's software rasteriser: the VSI env renders its rooms with OpenGL (docs/vsi.md). Not pinned:
# Debian's security updates replace these versions in the archive, so a pin would break later builds.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends libegl1 libgl1-mesa-dri \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 vistarl
WORKDIR /app

COPY pyproject.toml README.md ./
COPY clients ./clients
COPY services ./services
COPY trainer ./trainer
COPY cli ./cli
COPY devtools ./devtools
COPY configs ./configs

# torch from PyTorch's own index first, so the `train` extra does not pull the default CUDA wheels.
RUN case ",${EXTRAS}," in \
        *,train,*|*,all,*) pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}" ;; \
    esac \
    && pip install "./[${EXTRAS}]"

RUN mkdir -p /app/runs && chown 1000:1000 /app/runs
USER 1000:1000
EXPOSE 8000
CMD ["vistarl", "serve", "sokoban", "--host", "0.0.0.0", "--port", "8000"]
