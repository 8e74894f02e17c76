#!/usr/bin/env bash
# Builds the previous release's storesvr, allocsvr and seqctl (debug) for the rolling-upgrade test
# (sim/e2e/tests/rolling_upgrade.rs): a detached git worktree of the release's commit under the
# target directory, built into the same target directory so that every dependency compiled for
# this tree is reused (only the release's own crates compile), and its binaries copied to
# target/prev-release/<release>/. Cargo puts the release's binaries into target/debug/ too; this
# tree's binaries found there before are put back afterwards. scripts/test.sh runs this after
# `cargo build --workspace --bins`, whose dependencies it then reuses.
#
#   ./scripts/prev-release.sh        # builds once; later runs only check the copy is there
#
# Fails, saying why, when git or the release's commit is missing (a shallow clone fetches it from
# its remote first): the test cannot be run without it, and a skipped upgrade test would pass
# having checked nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The release the upgrade test starts from, pinned by commit. Bump both together when a release is
# cut (docs/operations/upgrades.md lists what changed between them).
PREV_RELEASE=0.1.0
PREV_COMMIT=a56e3daf008800e7ec1276a912fde4b7ecec20c5

target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
out="$target/prev-release/$PREV_RELEASE"
src="$target/prev-release/src-$PREV_RELEASE"
bins=(storesvr allocsvr seqctl)

built() {
  [ -f "$out/COMMIT" ] && [ "$(cat "$out/COMMIT")" = "$PREV_COMMIT" ] || return 1
  for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done
}
if built; then
  echo "== previous release $PREV_RELEASE already built in $out"
  exit 0
fi

command -v git >/dev/null || { echo "prev-release.sh: git is needed to check out $PREV_RELEASE" >&2; exit 1; }
# A shallow clone with a remote can fetch the release's commit; anything else fails below.
if ! git cat-file -e "$PREV_COMMIT^{commit}" 2>/dev/null && [ "$(git rev-parse --is-shallow-repository)" = true ]; then
  remote=$(git remote | head -n 1)
  [ -z "$remote" ] || git fetch --quiet --depth=1 "$remote" "$PREV_COMMIT" || true
fi
if ! git cat-file -e "$PREV_COMMIT^{commit}" 2>/dev/null; then
  echo "prev-release.sh: commit $PREV_COMMIT (release $PREV_RELEASE) is not in this clone's history;" >&2
  echo "the rolling-upgrade test needs it. In a shallow clone run: git fetch --unshallow" >&2
  exit 1
fi

started=$SECONDS
if [ "$(git -C "$src" rev-parse HEAD 2>/dev/null || true)" != "$PREV_COMMIT" ]; then
  # A stale or broken copy (another commit, or its worktree metadata pruned): start again.
  rm -rf "$src"
  git worktree prune
  git worktree add --detach "$src" "$PREV_COMMIT" >/dev/null
fi
echo "== building previous release $PREV_RELEASE ($PREV_COMMIT) in $src"
args=()
for b in "${bins[@]}"; do args+=(-p "$b"); done
# This tree's binaries in target/debug/, kept aside while the release's build overwrites them.
keep="$target/prev-release/kept"
rm -rf "$keep" && mkdir -p "$keep"
for b in "${bins[@]}"; do [ ! -f "$target/debug/$b" ] || cp -p "$target/debug/$b" "$keep/$b"; done
(cd "$src" && CARGO_TARGET_DIR="$target" cargo build --locked --bins "${args[@]}")
mkdir -p "$out"
for b in "${bins[@]}"; do
  cp "$target/debug/$b" "$out/$b"
  # A rename, not a copy: target/debug/<bin> is a hard link to the release's binary in deps/,
  # which a copy would overwrite through the link.
  if [ -f "$keep/$b" ]; then mv -f "$keep/$b" "$target/debug/$b"; else rm -f "$target/debug/$b"; fi
done
rm -rf "$keep"
echo "$PREV_COMMIT" >"$out/COMMIT"
echo "== previous release $PREV_RELEASE built into $out in $((SECONDS - started)) s"
