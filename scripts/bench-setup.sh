#!/usr/bin/env bash
# Installs what `blobstream bench` can use besides the workspace itself: iperf3, the
# reference line of `blobstream bench transfer`. Idempotent: does nothing when everything is
# already installed.
set -euo pipefail

if command -v iperf3 >/dev/null 2>&1; then
    echo "iperf3 already installed: $(command -v iperf3)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "apt-get not found: install iperf3 with your package manager" >&2
    exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

# noninteractive: the Debian package otherwise asks whether to run iperf3 as a daemon.
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y iperf3
echo "iperf3 installed: $(command -v iperf3)"
