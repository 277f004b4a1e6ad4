#!/usr/bin/env bash
# build_rev.sh — the tessera binary of an earlier revision, for before/after
# comparisons (tools/check_unchanged.sh, tools/bench_before_after.sh).
#
#   tools/build_rev.sh REV      prints "BINARY TREE" on stdout
#
# REV is checked out once in a git worktree under ~/.cache/tessera/
# (outside the repository, so Bazel's //... never sees it) and built there;
# the binary is cached by commit, so a second call prints at once. TREE is
# the worktree, the TESSERA_HOME that binary's presets come from.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REV="${1:?usage: tools/build_rev.sh REV}"
cd "$ROOT"
sha="$(git rev-parse --verify "$REV^{commit}")"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/tessera"
TREE="$CACHE/unchanged-tree-$sha"
BIN="$CACHE/unchanged-tessera-$sha"
if [[ ! -x "$BIN" ]]; then
  mkdir -p "$CACHE"
  [[ -d "$TREE" ]] || git worktree add --detach "$TREE" "$sha" >/dev/null
  (cd "$TREE" && bazel build --ui_event_filters=-info,-progress --noshow_progress \
    //tools:tessera) >&2
  cp "$TREE/bazel-bin/tools/tessera" "$BIN.tmp"
  mv "$BIN.tmp" "$BIN"
fi
echo "$BIN $TREE"
