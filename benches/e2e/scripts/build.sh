#!/usr/bin/env bash
# build.sh REV: release build (with symbols) of staleguard at REV into $BINS/REV (default
# ./bins), in a detached worktree beside this one and a target directory shared by every
# REV ($BISECT_TARGET, default ../bisect-target), so each build compiles only what changed.
set -euo pipefail
rev=$1
repo=$(git rev-parse --show-toplevel)
bins=$(realpath -m "${BINS:-bins}"); mkdir -p "$bins"
export CARGO_INCREMENTAL=0 CARGO_TARGET_DIR=$(realpath -m "${BISECT_TARGET:-$repo/../bisect-target}")
export CARGO_PROFILE_RELEASE_DEBUG=1 CARGO_PROFILE_RELEASE_STRIP=none
wt=$repo/../bisect-$rev
[ -d "$wt" ] || git -C "$repo" worktree add --detach "$wt" "$rev" >/dev/null
(cd "$wt" && nice cargo build --release --no-default-features --bin staleguard 2>&1 | tail -2)
cp "$CARGO_TARGET_DIR/release/staleguard" "$bins/$rev"
git -C "$repo" worktree remove --force "$wt"
echo built "$rev"
