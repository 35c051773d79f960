#!/usr/bin/env bash
# Build tools that make the build faster code when present: NASM, which libjpeg-turbo (bundled
# in turbojpeg-sys, for grey lossy JPEG in DICOM) needs for its SIMD code; without it the
# plain C code is built (about three times slower decodes) and cargo warns. Installs NASM
# with apt-get if it is missing (as root, or with sudo). Never fails the caller: the build
# works without it.
#
#   scripts/build-deps.sh
set -uo pipefail
say() { echo "build-deps: $*" >&2; }
if command -v nasm >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "no nasm, and no apt-get to install it: libjpeg-turbo builds without its SIMD code"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
install() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nasm >&2; }
if install || { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 && install; }; then
    say "installed nasm: $(nasm -v)"
else
    say "could not install nasm: libjpeg-turbo builds without its SIMD code"
fi
exit 0
