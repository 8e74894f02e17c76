#!/usr/bin/env bash
# Runs every test of seqsvr-rs: unit, real-process integration and end-to-end tests, and a short
# seeded simulator run. The end-to-end tests also run programs others wrote against the cluster
# (promtool on the alert rules, curl and redis-cli on the front ends, ip netns and nft for the
# multi-host rehearsal), and a test whose program is missing fails rather than pass having
# checked nothing; so this installs the missing ones first, from Debian's packages (as root).
#
#   ./scripts/test.sh                       # what CI runs
#   ./scripts/test.sh -p storesvr           # arguments go to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have promtool || need+=(prometheus)
have ip || need+=(iproute2)
have nft || need+=(nftables)
have redis-cli || need+=(redis-tools)
have curl || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && have apt-get; then
    echo "== installing ${need[*]} (Debian packages the end-to-end tests run)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "the end-to-end tests need these Debian packages: ${need[*]}" >&2
    echo "install them (as root: apt-get install ${need[*]}) and run this again" >&2
    exit 2
  fi
fi

cargo build --workspace --bins
# The previous release's binaries for the rolling-upgrade test (sim/e2e/tests/rolling_upgrade.rs),
# built after this tree's so that it reuses every dependency compiled for them.
./scripts/prev-release.sh

if [ $# -gt 0 ]; then
  cargo test "$@"
else
  cargo test --workspace
fi
