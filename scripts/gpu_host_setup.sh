#!/usr/bin/env bash
# source scripts/gpu_host_setup.sh DIR    (on an offline GPU host, in the checkout; DIR from
#                                          scripts/gpu_host_packages.sh, carried over)
# Installs DIR's wheels beside the host's own CUDA torch and transformers (under /tmp/site), unpacks its
# Debian packages (Redis 7, glvnd's libEGL and libGL) under /tmp/redis, and exports what `vistarl up`,
# `make gpu-test` and the GPU scripts then need: PYTHONPATH, PATH, LD_LIBRARY_PATH, and PYTHON=python3.
dir=${1:?usage: source scripts/gpu_host_setup.sh DIR}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$dir"/*.whl
for deb in "$dir"/*.deb; do dpkg -x "$deb" /tmp/redis; done
libs=/tmp/redis/usr/lib/x86_64-linux-gnu
ln -sf libEGL.so.1 "$libs/libEGL.so"  # the names moderngl opens
ln -sf libGL.so.1 "$libs/libGL.so"
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/redis/usr/bin:$PATH LD_LIBRARY_PATH=$libs PYTHON=python3
redis-server --version
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
