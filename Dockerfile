# One image for every vistarl role; EXTRAS picks what gets installed.
#   docker build -t vistarl .                       # everything (CPU torch)
#   docker build -t vistarl-env --build-arg EXTRAS=server .   # env servers only: no torch
FROM python:3.11-slim

ARG EXTRAS=server,train
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

# EGL and Mesa's software rasteriser: the VSI env renders its rooms with OpenGL (docs/vsi.md).
RUN apt-get update && apt-get install -y --no-install-recommends libegl1 libgl1-mesa-dri \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 vistarl
WORKDIR /app

COPY pyproject.toml README.md ./
COPY clients ./clients
COPY services ./services
COPY trainer ./trainer
COPY cli ./cli
COPY configs ./configs

# CPU torch from PyTorch's own index first, so the `train` extra does not pull CUDA wheels.
RUN if echo "$EXTRAS" | grep -q train; then \
        pip install torch --index-url https://download.pytorch.org/whl/cpu; \
    fi \
    && pip install ".[${EXTRAS}]"

RUN mkdir -p /app/runs && chown vistarl /app/runs
USER vistarl
EXPOSE 8000
CMD ["vistarl", "serve", "sokoban", "--host", "0.0.0.0", "--port", "8000"]
