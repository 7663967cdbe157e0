#!/usr/bin/env bash
# Print the Debian archive that this machine's apt takes its own release from, as apt's configured
# sources give it (`apt-get indextargets`, whatever form the sources are written in), so that
# scripts/ensure-docker.sh and scripts/standin-images.sh fetch from the machine's mirror and never from a
# host written into the project. DEBIAN_MIRROR overrides it. Exit 1, naming the fix, when apt has none.
set -euo pipefail
if [ -n "${DEBIAN_MIRROR:-}" ]; then
    echo "${DEBIAN_MIRROR%/}"
    exit 0
fi
# shellcheck disable=SC1091  # the machine's own release file
release=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
# shellcheck disable=SC2016  # apt expands the $(...) fields itself
uri=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' 2>/dev/null \
    | awk -v release="$release" '$2 == release && $3 == "main" { print $1; exit }')
if [ -z "$uri" ]; then
    echo "error: apt's sources name no archive of Debian ${release:-(unknown release)} main; set DEBIAN_MIRROR" >&2
    exit 1
fi
echo "${uri%/}"
