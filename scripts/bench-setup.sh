#!/usr/bin/env bash
# Installs the peers `blobstream bench` measures against, besides the workspace itself:
#   - iperf3 (apt) for `bench transfer`;
#   - OpenCV and Pillow (PyPI, in the virtualenv bench/.venv) for `bench filters`.
# Idempotent: does nothing for what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v iperf3 >/dev/null 2>&1; then
    echo "iperf3 already installed: $(command -v iperf3)"
elif command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    # noninteractive: the Debian package otherwise asks whether to run iperf3 as a daemon.
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y iperf3
    echo "iperf3 installed: $(command -v iperf3)"
else
    echo "apt-get not found: install iperf3 with your package manager" >&2
fi

VENV=bench/.venv
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import cv2, PIL, numpy' 2>/dev/null; then
    echo "OpenCV and Pillow already installed in $VENV"
else
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        opencv-python-headless pillow numpy
    echo "OpenCV and Pillow installed in $VENV"
fi
