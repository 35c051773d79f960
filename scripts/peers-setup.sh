#!/usr/bin/env bash
# Installs the real servers the distributed-backend tests and benchmarks run against, and
# prints where they are (`KEY=path` lines, for `eval`):
#   - Garage, the Rust S3-compatible distributed object store: `cargo install garage` once
#     (about 15-25 minutes on 2 cores), cached in $BLOBSTREAM_CACHE (default
#     ~/.cache/blobstream) so later runs and fresh clones on the same machine reuse it;
#   - PostgreSQL server binaries (Debian's `postgresql`; the tests run their own `initdb` +
#     `postgres` in a temporary directory on a free loopback port, never the system service).
# Idempotent: does nothing for what is already there.
#
#   eval "$(scripts/peers-setup.sh)"   # sets BLOBSTREAM_GARAGE and BLOBSTREAM_PG_BIN
set -euo pipefail

GARAGE_VERSION=2.5.0
CACHE="${BLOBSTREAM_CACHE:-$HOME/.cache/blobstream}"
GARAGE_ROOT="$CACHE/garage-$GARAGE_VERSION"
GARAGE="$GARAGE_ROOT/bin/garage"

# Everything but the KEY=path lines goes to stderr, so `eval` sees only those.
exec 3>&1 1>&2

if [ -x "$GARAGE" ]; then
    echo "peers-setup: garage $GARAGE_VERSION cached: $GARAGE"
else
    echo "peers-setup: building garage $GARAGE_VERSION once into $GARAGE_ROOT (this takes a while)"
    mkdir -p "$CACHE"
    # Only the SQLite metadata engine (no LMDB, no K2V, no metrics): fewer crates to build.
    # A throwaway target directory, and a lock so two runs at once don't both build.
    (
        flock 9
        if [ ! -x "$GARAGE" ]; then
            TMP_TARGET=$(mktemp -d "$CACHE/garage-build.XXXXXX")
            trap 'rm -rf "$TMP_TARGET"' EXIT
            cargo install garage --version "$GARAGE_VERSION" --locked \
                --no-default-features --features bundled-libs,sqlite \
                --root "$GARAGE_ROOT" --target-dir "$TMP_TARGET"
        fi
    ) 9>"$CACHE/garage.lock"
fi

find_pg() {
    for d in /usr/lib/postgresql/*/bin; do
        if [ -x "$d/postgres" ] && [ -x "$d/initdb" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}
if PG_BIN=$(find_pg); then
    echo "peers-setup: postgresql server in $PG_BIN"
else
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql
    PG_BIN=$(find_pg)
    echo "peers-setup: installed postgresql: $PG_BIN"
fi
# Debian's package starts a cluster on port 5432; the tests never use it.

echo "BLOBSTREAM_GARAGE=$GARAGE" >&3
echo "BLOBSTREAM_PG_BIN=$PG_BIN" >&3
