# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Start and stop a weightfs mount from a bash script (tests, demo, benchmark). Source this file:
#
#   . tests/lib/mount.sh
#   wfs_mount build "$store" "$mnt" [-o passthrough=off ...] || exit 1
#   trap 'wfs_umount "$mnt"' EXIT
#   ... use "$mnt"; wfs_pid "$mnt"; wfs_rss_kib "$mnt" ...
#   wfs_umount "$mnt"          # returns the daemon's exit status
#
# wfs_mount runs `BUILD/weightfs STORE MNT -f [opts...]` in the background of the calling shell (call it
# from that shell, not from a $(...) subshell, or wfs_umount cannot wait for the daemon). It creates
# STORE and MNT when missing (an empty STORE directory is a fresh store: the daemon lays it out),
# sends the daemon's output to a log file, and waits until MNT is a mount point. Several mounts may be
# held at once; each is known by its MNT path as given.
#
# Settings (environment):
#   WFS_MOUNT_TIMEOUT  seconds to wait for the mount to appear and the daemon to exit (default 10)
#   WFS_MOUNT_LOG      daemon log file (default: MNT's parent dir/weightfs-<MNT basename>.log)
#
# The functions print one clear line on stderr on failure (with the log's tail) and return non-zero;
# they never exit the caller.

declare -gA WFS_MOUNT_PIDS=()
declare -gA WFS_MOUNT_LOGS=()

# Print the last lines of MNT's daemon log, indented, on stderr.
wfs_log_tail() {
	local log=${WFS_MOUNT_LOGS[$1]:-}
	[ -n "$log" ] && [ -s "$log" ] || return 0
	echo "--- last lines of $log:" >&2
	tail -n "${2:-20}" "$log" | sed 's/^/    /' >&2
}

# wfs_mount BUILD STORE MNT [opts...]: mount STORE on MNT with BUILD/weightfs; 0 once MNT is mounted.
wfs_mount() {
	if [ $# -lt 3 ]; then
		echo "wfs_mount: usage: wfs_mount BUILD STORE MNT [opts...]" >&2
		return 2
	fi
	local build=$1 store=$2 mnt=$3
	shift 3
	local bin=$build/weightfs
	local timeout=${WFS_MOUNT_TIMEOUT:-10}
	if [ ! -x "$bin" ]; then
		echo "wfs_mount: $bin is missing or not executable (run make first)" >&2
		return 1
	fi
	if ! command -v fusermount3 >/dev/null || [ ! -c /dev/fuse ]; then
		echo "wfs_mount: FUSE is not available here (need fusermount3 and /dev/fuse; run .ci/setup-debian)" >&2
		return 1
	fi
	mkdir -p "$store" "$mnt" || return 1
	if mountpoint -q "$mnt"; then
		echo "wfs_mount: $mnt is already a mount point (unmount it first: fusermount3 -u $mnt)" >&2
		return 1
	fi
	local log=${WFS_MOUNT_LOG:-$(dirname "$mnt")/weightfs-$(basename "$mnt").log}
	: >"$log" || return 1
	WFS_MOUNT_LOGS[$mnt]=$log
	"$bin" "$store" "$mnt" -f "$@" >>"$log" 2>&1 &
	local pid=$!
	WFS_MOUNT_PIDS[$mnt]=$pid
	local deadline=$((SECONDS + timeout))
	while ! mountpoint -q "$mnt"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			local rc=0
			wait "$pid" || rc=$?
			unset "WFS_MOUNT_PIDS[$mnt]"
			echo "wfs_mount: weightfs exited with status $rc before $mnt was mounted" >&2
			wfs_log_tail "$mnt"
			return 1
		fi
		if [ "$SECONDS" -ge "$deadline" ]; then
			kill "$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
			unset "WFS_MOUNT_PIDS[$mnt]"
			echo "wfs_mount: $mnt did not become a mount point within ${timeout}s (daemon pid $pid killed)" >&2
			wfs_log_tail "$mnt"
			return 1
		fi
		sleep 0.05
	done
	return 0
}

# wfs_pid MNT: print the daemon's pid (empty and status 1 when MNT was not mounted by wfs_mount).
wfs_pid() {
	local pid=${WFS_MOUNT_PIDS[$1]:-}
	[ -n "$pid" ] || return 1
	echo "$pid"
}

# wfs_rss_kib MNT: print the daemon's resident memory (VmRSS) in KiB.
wfs_rss_kib() {
	local pid
	pid=$(wfs_pid "$1") || { echo "wfs_rss_kib: no daemon known for $1" >&2; return 1; }
	awk '/^VmRSS:/ { print $2; found = 1 } END { exit !found }' "/proc/$pid/status" 2>/dev/null ||
		{ echo "wfs_rss_kib: cannot read VmRSS of pid $pid" >&2; return 1; }
}

# wfs_umount MNT: unmount MNT and wait for its daemon; returns the daemon's exit status (0 when it was
# not running). Safe to call twice and from an EXIT trap. If the daemon does not exit within the
# timeout it is killed and the mount is detached lazily; that returns 1.
wfs_umount() {
	local mnt=$1
	local pid=${WFS_MOUNT_PIDS[$mnt]:-}
	local timeout=${WFS_MOUNT_TIMEOUT:-10}
	local rc=0
	if mountpoint -q "$mnt" 2>/dev/null; then
		if ! fusermount3 -u "$mnt" 2>/dev/null; then
			# Busy (a process still has a file open there): retry briefly, then detach lazily.
			local tries=0
			while mountpoint -q "$mnt" && ! fusermount3 -u "$mnt" 2>/dev/null; do
				tries=$((tries + 1))
				if [ "$tries" -ge $((timeout * 10)) ]; then
					echo "wfs_umount: $mnt is busy; detaching it lazily" >&2
					fusermount3 -u -z "$mnt" || true
					rc=1
					break
				fi
				sleep 0.1
			done
		fi
	fi
	[ -n "$pid" ] || return "$rc"
	local deadline=$((SECONDS + timeout))
	while kill -0 "$pid" 2>/dev/null; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			echo "wfs_umount: weightfs (pid $pid) did not exit within ${timeout}s after unmount; killing it" >&2
			kill -KILL "$pid" 2>/dev/null || true
			rc=1
			break
		fi
		sleep 0.05
	done
	local drc=0
	wait "$pid" 2>/dev/null || drc=$?
	unset "WFS_MOUNT_PIDS[$mnt]"
	if [ "$rc" -eq 0 ] && [ "$drc" -ne 0 ]; then
		echo "wfs_umount: weightfs for $mnt exited with status $drc" >&2
		wfs_log_tail "$mnt"
		rc=$drc
	fi
	return "$rc"
}

# The libweightfs.so a plain python3 can load for BUILD: BUILD's own, unless it is a sanitizer build
# (make asan: python would need the sanitizer's runtime loaded first), then build/'s beside it.
wfs_python_lib() {
	local lib=$1/libweightfs.so
	# not grep -q: nm would die of SIGPIPE under pipefail
	if nm -D "$lib" 2>/dev/null | grep ' __asan_init' >/dev/null; then
		lib=$(dirname "${BASH_SOURCE[0]}")/../../build/libweightfs.so
	fi
	printf '%s\n' "$lib"
}
