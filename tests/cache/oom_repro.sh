#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The original failure, small: an inference engine next to frozen weights in one memory cgroup.
#  (a) weights offloaded through weightfs and read (page cache, ~N MiB charged to the cgroup), then the
#      engine allocates anonymous memory until only N/2 of the limit is left: the kernel reclaims the
#      cache and the engine gets its memory; nobody is OOM-killed.
#  (b) the same with the weights held as locked anonymous memory (mlock: the pinned-offload stand-in):
#      they cannot be reclaimed, so the engine (or the holder) is OOM-killed or gets ENOMEM.
# cgroup v2 (memory.max, memory.swap.max=0); on a v1 host the memory controller's
# memory.limit_in_bytes is used instead. Prints "skip ..." when neither can be made here.
#   usage: tests/cache/oom_repro.sh BUILD_DIR    (WFS_OOM_MIB: N, default 128; root)
set -uo pipefail
B=$(cd "${1:-build}" && pwd) || exit 2
here=$(cd "$(dirname "$0")" && pwd)
N=${WFS_OOM_MIB:-128}
LIMIT=$((3 * N)) # MiB: the weights, the engine's 2.5 N, and room for the interpreters
py=$(command -v python3 || echo /usr/bin/python3)

cg='' ver=''
if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
	ver=2
	echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
	cg=/sys/fs/cgroup/wfs-oom-$$
elif [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
	ver=1
	cg=/sys/fs/cgroup/memory/wfs-oom-$$
else
	echo "skip: no cgroup v2 memory controller at /sys/fs/cgroup (and no v1 memory controller)"
	exit 0
fi
if ! mkdir "$cg" 2>/dev/null; then
	echo "skip: cannot create a child cgroup $cg (not root, or delegated elsewhere)"
	exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/wfs-oom.XXXXXX") || exit 1
. "$here/../lib/mount.sh"
cleanup() {
	[ -f "$cg/cgroup.procs" ] && while read -r p; do kill -9 "$p" 2>/dev/null; done <"$cg/cgroup.procs"
	sleep 0.2
	rmdir "$cg" 2>/dev/null
	wfs_umount "$work/mnt" >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT

# set_limit MIB, current (bytes), stat_line, oom_kills: the cgroup's knobs, v2 or v1.
set_limit() {
	if [ $ver = 2 ]; then
		echo $(($1 << 20)) >"$cg/memory.max"
		echo 0 >"$cg/memory.swap.max" 2>/dev/null
	else
		echo $(($1 << 20)) >"$cg/memory.limit_in_bytes"
		echo $(($1 << 20)) >"$cg/memory.memsw.limit_in_bytes" 2>/dev/null
	fi
}
current() { if [ $ver = 2 ]; then cat "$cg/memory.current"; else cat "$cg/memory.usage_in_bytes"; fi; }
peak() { if [ $ver = 2 ]; then cat "$cg/memory.peak" 2>/dev/null || echo 0; else cat "$cg/memory.max_usage_in_bytes"; fi; }
stat_line() {
	if [ $ver = 2 ]; then
		awk '$1 == "file" || $1 == "anon" || $1 == "unevictable" { printf "%s %d MiB  ", $1, $2 / 1048576 }' "$cg/memory.stat"
	else
		awk '$1 == "cache" || $1 == "rss" || $1 == "unevictable" { printf "%s %d MiB  ", $1, $2 / 1048576 }' "$cg/memory.stat"
	fi
}
oom_kills() {
	if [ $ver = 2 ]; then awk '$1 == "oom_kill" { print $2 }' "$cg/memory.events"
	else awk '$1 == "oom_kill" { print $2 }' "$cg/memory.oom_control"; fi
}
report() { echo "  $1: memory.current $(($(current) >> 20)) MiB (peak $(($(peak) >> 20))); memory.stat $(stat_line)"; }

# in_cgroup CMD...: run CMD in the cgroup (a shell moves itself in, then execs).
in_cgroup() { bash -c 'echo $$ > "$0/cgroup.procs" && exec "${@}"' "$cg" "$@"; }

ENGINE='
import mmap, sys
mib = int(sys.argv[1]); m = mmap.mmap(-1, mib << 20)
for i in range(0, mib << 20, 4096): m[i] = 1
print("engine: allocated and touched", mib, "MiB", flush=True)'
PINNER='
import ctypes, mmap, sys, time
mib = int(sys.argv[1]); m = mmap.mmap(-1, mib << 20)
libc = ctypes.CDLL(None, use_errno=True)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(mib << 20)) != 0:
    print("pinner: mlock failed errno", ctypes.get_errno(), flush=True); sys.exit(1)
print("pinner: locked", mib, "MiB", flush=True); time.sleep(600)'

if ! wfs_mount "$B" "$work/store" "$work/mnt"; then
	echo "oom_repro: cannot mount" >&2
	exit 1
fi
mkdir -p "$work/mnt/rank0"
head -c $((N << 20)) /dev/urandom >"$work/mnt/rank0/frozen.bin"
sync
"$B/weightfsctl" cache drop "$work/mnt" >/dev/null
set_limit $LIMIT
ENGINE_MIB=$((LIMIT - N / 2)) # until only N/2 of the limit is left
echo "cgroup v$ver $cg: limit $LIMIT MiB, weights $N MiB, engine asks $ENGINE_MIB MiB (leaves N/2 = $((N / 2)) MiB)"

# (a) page cache
k0=$(oom_kills)
in_cgroup cat "$work/mnt/rank0/frozen.bin" >/dev/null
report "after reading the weights through the mount"
out=$(in_cgroup "$py" -c "$ENGINE" "$ENGINE_MIB" 2>&1)
rc_a=$?
k1=$(oom_kills)
report "after the engine"
if [ $rc_a -eq 0 ] && [ "${k1:-0}" = "${k0:-0}" ]; then
	echo "page cache: engine OK ($out), OOM kills $((k1 - k0)): the kernel reclaimed the weights' cache"
	a_ok=1
else
	echo "page cache: engine FAILED (exit $rc_a, OOM kills $((k1 - k0))): $out"
	a_ok=0
fi

# (b) locked anonymous memory
"$B/weightfsctl" cache drop "$work/mnt" >/dev/null
in_cgroup "$py" -c "$PINNER" "$N" >"$work/pinner.out" 2>&1 &
for _ in $(seq 100); do grep -q pinner "$work/pinner.out" && break; sleep 0.1; done
report "after locking $N MiB ($(cat "$work/pinner.out"))"
out=$(in_cgroup "$py" -c "$ENGINE" "$ENGINE_MIB" 2>&1)
rc_b=$?
k2=$(oom_kills)
report "after the engine"
if [ $rc_b -ne 0 ] || [ "${k2:-0}" != "${k1:-0}" ]; then
	echo "locked memory: engine failed as expected (exit $rc_b$([ $rc_b = 137 ] && echo ': SIGKILL'), OOM kills $((k2 - k1)))"
	b_ok=1
else
	echo "locked memory: engine unexpectedly OK ($out)"
	b_ok=0
fi
echo "charging: pages are charged to the cgroup of the task that reads them in: the engine's reads of"
echo "  mounted files (passthrough) to its cgroup; the daemon's verification reads (first open of an"
echo "  object after a mount, -o verify=open) to the daemon's cgroup (here: $(cut -d: -f3 /proc/"$(wfs_pid "$work/mnt" 2>/dev/null || echo self)"/cgroup | sort -u | tr '\n' ' '))."
[ $a_ok = 1 ] && [ $b_ok = 1 ]
