#!/usr/bin/env bash
# Make sure the browser tests (tests/test_playground.py) have a browser: Debian's `chromium`, which
# playwright drives through its executable path (playwright's own browser download is not used).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "chromium is missing: installing it with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null \
        || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
    exit 0
fi
echo "error: no chromium, and not root to install it; install Debian's chromium package (or your system's)" >&2
exit 1
