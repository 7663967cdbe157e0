#!/usr/bin/env bash
# Make sure the tests can reach a Redis server: they start their own `redis-server` on a free
# port when the binary exists, and fall back to $REDIS_URL otherwise.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "redis-server is missing: installing it with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
    exit 0
fi
if [ -n "${REDIS_URL:-}" ]; then
    echo "no redis-server binary; tests will use REDIS_URL=$REDIS_URL" >&2
    exit 0
fi
echo "error: no redis-server binary, not root to install one, and REDIS_URL is not set" >&2
exit 1
