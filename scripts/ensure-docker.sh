#!/usr/bin/env bash
# Make sure a Docker daemon answers and `docker compose` (v2) runs, for `make compose-test`.
# As root on Debian it installs what is missing: Debian's Docker daemon package from this release, and
# the Compose v2 plugin unpacked from the next release's docker-compose package, which this release
# lacks, fetched from the archive that the machine's apt sources name (scripts/debian-mirror.sh).
# It starts dockerd in the background when none answers; the daemon stays up for later runs.
# Exit 0 when both work; else 1, with the reason on stderr.
set -euo pipefail
next_suite=${DEBIAN_NEXT_SUITE:-trixie}  # the Debian release whose docker-compose is v2
plugin_dir=/usr/libexec/docker/cli-plugins
log=${DOCKERD_LOG:-/var/log/dockerd-vistarl.log}

can_install() {
    [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1
}

install_compose_plugin() {
    # An apt configuration of its own: the system's sources stay as they are.
    local tmp mirror
    mirror=$(bash "$(dirname "$0")/debian-mirror.sh")
    tmp=$(mktemp -d)
    mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $next_suite main" \
        > "$tmp/sources.list"
    local opts=(-o "Dir::Etc::sourcelist=$tmp/sources.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o "APT::Sandbox::User=root")
    apt-get -qq "${opts[@]}" update
    (cd "$tmp" && apt-get -qq "${opts[@]}" download docker-compose)
    dpkg-deb -x "$tmp"/docker-compose_*.deb "$tmp/root"
    mkdir -p "$plugin_dir"
    install -m 755 "$tmp/root$plugin_dir/docker-compose" "$plugin_dir/docker-compose"
    rm -rf "$tmp"
}

daemon_package() {
    # Debian's package of dockerd, as its docker-compose package names it (its first recommendation).
    apt-cache show docker-compose 2>/dev/null | sed -n 's/^Recommends: \([^ ,(]*\).*/\1/p' | head -n 1
}

if ! command -v dockerd >/dev/null 2>&1; then
    can_install || { echo "error: no dockerd, and not root with apt-get to install it" >&2; exit 1; }
    package=$(daemon_package)
    [ -n "$package" ] || { apt-get update -qq && package=$(daemon_package); }
    [ -n "$package" ] || { echo "error: apt knows no package of dockerd (docker-compose's recommendation)" >&2; exit 1; }
    echo "dockerd is missing: installing $package with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null; }
fi
if ! docker compose version >/dev/null 2>&1; then
    can_install || { echo "error: no docker compose v2 plugin, and not root with apt-get to install one" >&2; exit 1; }
    echo "docker compose v2 is missing: unpacking it from Debian $next_suite's docker-compose package" >&2
    install_compose_plugin
fi
if ! docker info >/dev/null 2>&1; then
    echo "no Docker daemon answers: starting dockerd (log: $log)" >&2
    setsid nohup dockerd >"$log" 2>&1 &
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { echo "error: dockerd did not answer within 60 s; see $log" >&2; exit 1; }
fi
echo "docker: daemon $(docker info --format '{{.ServerVersion}}'), $(docker compose version --short | head -1) compose"
