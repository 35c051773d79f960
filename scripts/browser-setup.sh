#!/usr/bin/env bash
# Sets up the browser tests (web-tests/) on a fresh Debian machine, as root:
#   - Debian's chromium at /usr/bin/chromium (the test tool's own browser download is not
#     used: playwright-core drives the system browser);
#   - web-tests/node_modules from package-lock.json (`npm ci`).
# Idempotent: does nothing for what is already installed and up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "browser-setup: $*" >&2; }

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
    say "chromium already installed: $CHROMIUM"
elif command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    say "installing chromium with apt-get"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update >&2
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium >&2
    say "chromium installed: $(command -v chromium || echo "$CHROMIUM")"
else
    say "apt-get not found and $CHROMIUM missing: install Chromium and set CHROMIUM to its path"
    exit 1
fi

if ! command -v npm >/dev/null 2>&1; then
    say "npm not found: install Node.js 20 or later (with npm)"
    exit 1
fi

if [ ! -d web-tests/node_modules ] || [ web-tests/package-lock.json -nt web-tests/node_modules ]; then
    say "installing the test dependencies (npm ci in web-tests)"
    (cd web-tests && npm ci --no-audit --no-fund >&2)
    # npm ci may leave node_modules older than the lock file; mark it as up to date.
    touch web-tests/node_modules
else
    say "web-tests/node_modules is up to date"
fi
