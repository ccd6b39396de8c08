#!/usr/bin/env bash
# scripts/demo.sh: the first thing to run on a fresh machine. Installs what ndtrain needs
# and builds it (scripts/setup.sh), then runs the engine demo: a byte-bigram MLP
# (linear -> gelu -> linear) trained with SGD on the fortunes text, its loss going down,
# and a float64 gradient check of the model (examples/engine_demo.cpp).
#
#   scripts/demo.sh                 # setup + demo
#   scripts/demo.sh --steps 1000    # arguments go to engine_demo
#
# It builds only engine_demo. NDT_BUILD_DIR, NDT_CUDA and NDT_BUILD_TARGETS work as in
# scripts/setup.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NDT_BUILD_DIR:-build}"
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"

NDT_BUILD_TARGETS="${NDT_BUILD_TARGETS:-engine_demo}" "$ROOT/scripts/setup.sh"  # the demo alone
echo "[demo] $BUILD/engine_demo $*"
exec "$BUILD/engine_demo" "$@"
