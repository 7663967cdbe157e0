#!/usr/bin/env bash
# Make sure the VSI env can render: moderngl needs an EGL library and Mesa's drivers (llvmpipe on a
# CPU-only machine; docs/vsi.md). Usage: scripts/ensure-gl.sh PYTHON
set -euo pipefail
PY="${1:-python3}"
probe() {
    "$PY" -c "import moderngl; moderngl.create_standalone_context(backend='egl').release()" >/dev/null 2>&1
}
if probe; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "no OpenGL through EGL: installing libegl1, libgl1 and libgl1-mesa-dri with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libgl1 libgl1-mesa-dri >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libgl1 libgl1-mesa-dri >/dev/null; }
    probe && exit 0
fi
echo "error: no OpenGL context through EGL; install libegl1, libgl1 and libgl1-mesa-dri (Debian) or your system's Mesa EGL" >&2
exit 1
