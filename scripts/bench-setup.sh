#!/usr/bin/env bash
# Installs the peers `blobstream bench` measures against, besides the workspace itself:
#   - iperf3 (apt) for `bench transfer`;
#   - nginx and wrk (apt) for `bench http`;
#   - orthanc and orthanc-dicomweb (apt) for `bench dicomweb`;
#   - OpenCV and Pillow (PyPI, in the virtualenv bench/.venv) for `bench filters`;
#   - pyzmq (PyPI, same virtualenv): ZeroMQ PUB/SUB, the baseline of `bench fanout`.
#   - pydicom with its pylibjpeg, openjpeg, RLE and JPEG-LS plugins (same virtualenv): the
#     baseline of `bench dicom`.
# Idempotent: does nothing for what is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Debian packages, each named like the program it installs. nginx's binary is
# /usr/sbin/nginx, not on every user's PATH. `bench http` starts its own nginx on a free
# loopback port with a generated configuration; the system service is not used.
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
MISSING=()
for pkg in iperf3 nginx wrk; do
    if have "$pkg"; then
        echo "$pkg already installed: $(command -v "$pkg" || echo "/usr/sbin/$pkg")"
    else
        MISSING+=("$pkg")
    fi
done
# Orthanc with its DICOMweb plugin, the baseline of `bench dicomweb` (started by the benchmark on
# a free loopback port with its own configuration; the system service is not used).
if [ -x /usr/sbin/Orthanc ] && [ -f /usr/share/orthanc/plugins/libOrthancDicomWeb.so ]; then
    echo "orthanc and orthanc-dicomweb already installed"
else
    MISSING+=(orthanc orthanc-dicomweb)
fi
if [ "${#MISSING[@]}" -gt 0 ]; then
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""
        if [ "$(id -u)" -ne 0 ]; then
            SUDO="sudo"
        fi
        # noninteractive: the Debian package otherwise asks whether to run iperf3 as a daemon.
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${MISSING[@]}"
        echo "installed: ${MISSING[*]}"
    else
        echo "apt-get not found: install ${MISSING[*]} with your package manager" >&2
    fi
fi

VENV=bench/.venv
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import cv2, PIL, numpy, zmq, pydicom, pylibjpeg, openjpeg, rle, jpeg_ls' 2>/dev/null; then
    echo "OpenCV, Pillow, pyzmq, pydicom and its codec plugins already installed in $VENV"
else
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        opencv-python-headless pillow numpy pyzmq pydicom==3.0.2 pylibjpeg==2.1.0 \
        pylibjpeg-libjpeg==2.5.0 pylibjpeg-openjpeg==2.6.0 pylibjpeg-rle==2.2.0 pyjpegls==1.5.1
    echo "OpenCV, Pillow, pyzmq, pydicom and its codec plugins installed in $VENV"
fi
