#!/usr/bin/env bash
# Build stand-ins for the base images that the Dockerfile and docker-compose.yml name (python:3.11-slim,
# redis:7.4-alpine) from Debian packages, for machines that reach Debian's archive but no image registry.
# A minimal Debian root made by debootstrap, from the archive the machine's apt sources name
# (scripts/debian-mirror.sh; the root's apt keeps that source), becomes vistarl-standin/debian:bookworm; on it
# docker/standin/*.Dockerfile build vistarl-standin/python:3.11-slim and vistarl-standin/redis:7.4.
# The debootstrap tarball is cached in STANDIN_CACHE, the images in Docker's store, so a second run
# takes seconds (the stand-in Dockerfiles are built again each time, from Docker's cache). Prints the
# variables that point the build and the compose file at the stand-ins.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${STANDIN_CACHE:-/var/cache/vistarl-standin}
suite=bookworm
debian=vistarl-standin/debian:$suite
python=vistarl-standin/python:3.11-slim
redis=vistarl-standin/redis:7.4

has_image() {
    docker image inspect "$1" >/dev/null 2>&1
}

if ! has_image "$debian"; then
    tarball="$cache/debian-$suite-minbase.tar"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null 2>&1 \
            || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
        mkdir -p "$cache"
        root="$cache/rootfs.partial"
        rm -rf "$root"
        mirror=$(bash scripts/debian-mirror.sh)
        echo "debootstrap: a minimal Debian $suite from $mirror into $root" >&2
        nice -n 10 debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
            || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
        tar -C "$root" -cf "$tarball.partial" .
        mv "$tarball.partial" "$tarball"
        rm -rf "$root"
    fi
    docker import --change 'CMD ["bash"]' "$tarball" "$debian" >/dev/null
fi
for pair in "python:$python" "redis:$redis"; do
    name=${pair%%:*}
    image=${pair#*:}
    echo "building $image from docker/standin/$name.Dockerfile (cached after the first time)" >&2
    nice -n 10 docker build --quiet --network host --build-arg "DEBIAN_IMAGE=$debian" \
        -f "docker/standin/$name.Dockerfile" -t "$image" docker/standin >/dev/null
done
echo "PYTHON_IMAGE=$python"
echo "REDIS_IMAGE=$redis"
