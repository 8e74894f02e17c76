#!/usr/bin/env bash
# Installs the Snowflake gRPC server `ids-bench` compares against (ferroid-tonic-server 2.0.0 from
# crates.io, MIT OR Apache-2.0) with its own lock file, under the target dir, so that nothing of
# it is vendored into this repository; and builds the LD_PRELOAD shim that gives its accepted
# connections TCP_NODELAY (sim/bench/ferroid-nodelay.c says why), next to it:
#
#   ./sim/bench/install-ferroid.sh            # -> $CARGO_TARGET_DIR (or ./target)/peers/ferroid/{bin,lib}
#   FERROID_ROOT=/opt/ferroid ./sim/bench/install-ferroid.sh
#
# `ids-bench` looks for the binary in --ferroid-bin, then on PATH, then where this script puts it,
# and for the shim in ../lib/ beside the binary. The build runs in cargo's own temporary dir (not
# the shared target dir, whose lock a long build of the workspace may hold), deleted afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."

VERSION=2.0.0
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
ROOT=${FERROID_ROOT:-$TARGET/peers/ferroid}

if [ -x "$ROOT/bin/ferroid-tonic-server" ] && "$ROOT/bin/ferroid-tonic-server" --version 2>/dev/null | grep -q " $VERSION\$"; then
  echo "ferroid-tonic-server $VERSION already installed in $ROOT/bin"
else
  # ferroid-tonic-core's build script needs protoc. Without one on PATH (or in PROTOC), use the one
  # this workspace already builds with: the `protoc-bin-vendored` crate in cargo's registry.
  if [ -z "${PROTOC:-}" ] && ! command -v protoc >/dev/null; then
    case "$(uname -m)" in
      x86_64) ARCH=x86_64 ;;
      aarch64) ARCH=aarch_64 ;;
      *) ARCH=$(uname -m) ;;
    esac
    cargo fetch --locked >/dev/null 2>&1 || true
    PROTOC=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/protoc-bin-vendored-linux-"$ARCH"-*/bin/protoc 2>/dev/null | tail -1)
    if [ -z "$PROTOC" ]; then
      echo "no protoc: install one (apt-get install protobuf-compiler) or set PROTOC" >&2
      exit 2
    fi
    export PROTOC
  fi
  # --locked: the versions ferroid was released with, not whatever is newest today.
  env -u CARGO_TARGET_DIR cargo install --locked ferroid-tonic-server --version "$VERSION" --root "$ROOT"
  echo "installed: $ROOT/bin/ferroid-tonic-server"
fi

# `cc` is the C compiler (and linker) rustc already needs on Linux.
mkdir -p "$ROOT/lib"
cc -shared -fPIC -O2 -Wall -o "$ROOT/lib/ferroid-nodelay.so" sim/bench/ferroid-nodelay.c -ldl
echo "built: $ROOT/lib/ferroid-nodelay.so"
