#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Mounting like any filesystem (docs/mounting.md): make install / uninstall with PREFIX and DESTDIR;
# mount -t fuse.weightfs through fuse3's mount.fuse3 and through mount.fuse.weightfs; mount -T with a
# private fstab; an fstab line through systemd-fstab-generator, systemd-analyze verify and the mount /
# umount commands systemd runs for the unit; the example .mount unit; umount and SIGTERM ending the
# daemon with exit 0 and a clean store (weightfsctl fsck). Also weightfsctl stage's progress line,
# which needs a mount that can be made slow.
# Root only. It runs itself in a private mount namespace where overlays put a `make install
# DESTDIR=... PREFIX=/usr` over /usr/bin and /sbin, where mount(8) looks: nothing outside the test
# changes. Daemon exit statuses come from tests/cli/subreaper.py (python3). Prints one ok/FAIL/skip
# line per check and closes with "mount: N passed, N failed, N skipped".
#   usage: tests/cli/test_mount.sh BUILD_DIR
set -uo pipefail

if [ $# -ne 1 ]; then
	echo "usage: $0 BUILD_DIR" >&2
	exit 2
fi
REPO=$(cd "$(dirname "$0")/../.." && pwd) || exit 2
B=$(cd "$1" && pwd) || exit 2
for f in weightfs weightfsctl libweightfs.so; do
	if [ ! -e "$B/$f" ]; then
		echo "mount: $B/$f is missing (run make all)" >&2
		echo "mount: 0 passed, 1 failed"
		exit 1
	fi
done

# Into a private mount namespace: the overlays and mounts below are never seen outside it.
if [ "${WFS_TEST_MOUNT_NS:-}" != 1 ]; then
	if ! unshare --mount --propagation private true 2>/dev/null; then
		echo "mount: cannot make a private mount namespace (unshare --mount needs root)" >&2
		echo "mount: 0 passed, 1 failed"
		exit 1
	fi
	WFS_TEST_MOUNT_NS=1 exec unshare --mount --propagation private "$BASH" "$0" "$@"
fi

CTL=$B/weightfsctl
UNIT='data-skyrl-frozen\x2doffload.mount'
SBIN=$(readlink -f /sbin)   # mount(8) looks for helpers in /sbin (/usr/sbin on a merged /usr)
PYTHON=$(command -v python3 || true)
work=$(mktemp -d "${TMPDIR:-/tmp}/wfs-fstab.XXXXXX") || exit 1
ROOT=$work/root             # make install DESTDIR=$ROOT PREFIX=/usr
overlays=()                 # directories overlaid in this namespace, in order
declare -A reaper           # subreaper pid by name

. "$REPO/tests/lib/check.sh" # ok, fail, skip, verdict, run, expect

# mounted MNT: "FSTYPE SOURCE OPTIONS" of the mount on MNT in this namespace; exit 1 when none.
mounted() {
	awk -v m="$1" '$5 == m { for (i = 7; $i != "-"; i++); print $(i + 1), $(i + 2), $6; f = 1 }
		END { exit !f }' /proc/self/mountinfo
}
# daemon_pids PREFIX: pids of weightfs processes whose STORE argument is PREFIX or lies under it.
daemon_pids() {
	local c argv
	for c in /proc/[0-9]*/cmdline; do
		mapfile -d '' argv 2>/dev/null <"$c" || continue
		[ ${#argv[@]} -ge 3 ] || continue
		[[ ${argv[0]##*/} == weightfs ]] || continue
		[[ ${argv[1]} == "$1" || ${argv[1]} == "$1"/* ]] || continue
		c=${c#/proc/}
		echo "${c%/cmdline}"
	done
}
# daemon_args STORE: the running daemon's command line, arguments separated by spaces.
daemon_args() {
	local pid
	pid=$(daemon_pids "$1" | head -n 1)
	[ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline"
}

# reaped NAME COMMAND...: run COMMAND (a mount) under subreaper.py, which outlives it to collect the
# daemon's exit status; waits (30 s at most) for COMMAND to exit: its status in $rc, stderr in $err.
reaped() {
	local name=$1 i
	shift
	: >"$work/$name.status"
	if [ -z "$PYTHON" ]; then
		run "$@"
		return
	fi
	"$PYTHON" "$REPO/tests/cli/subreaper.py" "$work/$name.status" "$@" >/dev/null 2>"$work/$name.stderr" &
	reaper[$name]=$!
	rc=
	for ((i = 0; i < 300; i++)); do
		rc=$(sed -n 's/^command //p' "$work/$name.status")
		[ -n "$rc" ] && break
		sleep 0.1
	done
	[ -n "$rc" ] || rc=124
	out='' err=$(<"$work/$name.stderr")
}
# daemon_exit NAME: how the processes left by reaped NAME ended ("exit 0" for a clean daemon),
# waiting 15 s at most; "unknown" without python3.
daemon_exit() {
	local pid=${reaper[$1]:-} i
	if [ -z "$pid" ]; then
		echo unknown
		return
	fi
	for ((i = 0; i < 150; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		echo "still running after 15 s"
		return
	fi
	wait "$pid" 2>/dev/null
	unset "reaper[$1]"
	sed -nE 's/^(exit|signal) [0-9]+ /\1 /p' "$work/$1.status" | paste -sd ';' -
}
# expect_daemon_exit NAME: the daemon left by reaped NAME exited 0.
expect_daemon_exit() {
	local how
	how=$(daemon_exit "$1")
	case $how in
	'exit 0') ok "$2: daemon exits 0" ;;
	unknown) skip "$2: daemon exit status (no python3 for tests/cli/subreaper.py)" ;;
	*) fail "$2: daemon exits 0" "it: ${how:-nothing was reparented}" ;;
	esac
}
# expect_clean NAME STORE: nothing holds STORE's lock and fsck finds no problem.
expect_clean() {
	if flock -w 10 "$2/lock" true; then
		run "$CTL" fsck "$2"
		expect "$1: weightfsctl fsck STORE: exit 0" 0 " 0 problems, 0 repaired, 0 left\$"
	else
		fail "$1: the store's lock is still held 10 s later"
	fi
}
# expect_io NAME MNT: a file written under MNT reads back.
expect_io() {
	if printf 'tensor %s' "$1" >"$2/t" && [ "$(cat "$2/t")" = "tensor $1" ]; then
		ok "$1: a file written under the mount reads back"
	else
		fail "$1: a file written under the mount reads back"
	fi
}
# expect_umount NAME MNT [UMOUNT ARGS...]: umount MNT exits 0 and MNT is no longer a mount point.
expect_umount() {
	local name=$1 m=$2
	shift 2
	run umount "$m" "$@"
	expect "$name: umount${*:+ $*} exits 0" 0
	if mounted "$m" >/dev/null; then
		fail "$name: not mounted after umount" "$(mounted "$m")"
	fi
}

cleanup() {
	local m p i
	for m in "$work"/mnt*; do
		if mounted "$m" >/dev/null; then
			umount "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null
		fi
	done
	for p in $(daemon_pids "$work"); do
		kill -CONT "$p" 2>/dev/null # the stage check stops one for 2 s
		kill -TERM "$p" 2>/dev/null
	done
	for ((i = ${#overlays[@]} - 1; i >= 0; i--)); do
		"$work/umount" "${overlays[i]}" 2>/dev/null
	done
	if grep -q " $work" /proc/self/mountinfo; then
		echo "mount: something is still mounted under $work: left in place" >&2
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- make install / uninstall: PREFIX and DESTDIR ---------------------------------------------------
# -o: install what is built, never rebuild it from sources that may be changing under the test.
mk() {
	make -s -C "$REPO" B="$B" -o "$B/weightfs" -o "$B/weightfsctl" -o "$B/libweightfs.so" "$@"
}
# expect_uninstalled NAME DESTDIR: no file or link left under DESTDIR, no share/doc/weightfs.
expect_uninstalled() {
	local left
	left=$(find "$2" -mindepth 1 \( -type f -o -type l -o -path '*/doc/weightfs' \) -print)
	if [ -z "$left" ]; then
		ok "$1: nothing left under DESTDIR"
	else
		fail "$1: nothing left under DESTDIR" "left: $left"
	fi
}
for prefix in /opt/weightfs /usr; do
	dest=$work/dest${prefix//\//-}
	[ $prefix = /usr ] && dest=$ROOT
	run mk install DESTDIR="$dest" PREFIX="$prefix"
	expect "make install PREFIX=$prefix DESTDIR=...: exit 0" 0
	missing=
	for f in bin/weightfs bin/weightfsctl lib/libweightfs.so sbin/mount.fuse.weightfs sbin/umount.fuse.weightfs \
		"share/doc/weightfs/examples/$UNIT" share/man/man8/weightfs.8; do
		[ -e "$dest$prefix/$f" ] || missing="$missing $f"
	done
	if [ -z "$missing" ]; then
		ok "make install PREFIX=$prefix: daemon, helper, example unit, man pages under DESTDIR/PREFIX"
	else
		fail "make install PREFIX=$prefix: daemon, helper, example unit, man pages under DESTDIR/PREFIX" \
			"missing:$missing"
	fi
	outside=$(find "$dest" \( -type f -o -type l \) ! -path "$dest$prefix/*")
	[ -z "$outside" ]
	verdict "make install PREFIX=$prefix: nothing outside DESTDIR/PREFIX" $? "$outside"
	if grep -qx "bindir=$prefix/bin" "$dest$prefix/sbin/mount.fuse.weightfs" 2>/dev/null &&
		[ "$(stat -c %a "$dest$prefix/sbin/mount.fuse.weightfs")" = 755 ]; then
		ok "make install PREFIX=$prefix: mount.fuse.weightfs (0755) runs $prefix/bin/weightfs"
	else
		fail "make install PREFIX=$prefix: mount.fuse.weightfs (0755) runs $prefix/bin/weightfs" \
			"$(grep -n '^bindir=' "$dest$prefix/sbin/mount.fuse.weightfs" 2>&1)"
	fi
	if [ $prefix != /usr ]; then
		run mk uninstall DESTDIR="$dest" PREFIX="$prefix"
		expect "make uninstall PREFIX=$prefix DESTDIR=...: exit 0" 0
		expect_uninstalled "make uninstall PREFIX=$prefix" "$dest"
	fi
done
# The /usr install stays for the mounts below, and is uninstalled at the end.

# ---- mount -t fuse.weightfs through fuse3's mount.fuse3 ---------------------------------------------
# mount(8) runs /sbin/mount.fuse.weightfs, else /sbin/mount.fuse (mount.fuse3), which runs the program
# named by the type's suffix through /bin/sh -c. mount(8) removes PATH from the helper's environment,
# so that shell searches its default PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:...).
# umount itself runs from /usr/bin, and a running program keeps its overlay busy: the overlays are
# taken down with a copy made before they went up.
cp "$(command -v umount)" "$work/umount" || exit 1
overlay() { # overlay DIR LOWER: LOWER's files over DIR, in this namespace
	if mount -t overlay overlay -o "lowerdir=$2:$1" "$1" 2>"$work/stderr"; then
		overlays+=("$1")
		return 0
	fi
	echo "mount: cannot overlay $2 on $1: $(<"$work/stderr")" >&2
	return 1
}
have_overlay=true
overlay /usr/bin "$ROOT/usr/bin" || have_overlay=false

S=$work/store-fuse3 M=$work/mnt-fuse3
mkdir -p "$M"
found=$(env -i /bin/sh -c 'command -v weightfs')
if ! $have_overlay; then
	skip "mount -t through mount.fuse3: overlayfs is not available to put weightfs in /usr/bin"
elif [ ! -x /sbin/mount.fuse ]; then
	skip "mount -t through mount.fuse3: /sbin/mount.fuse is missing (Debian package fuse3)"
elif [ -e /sbin/mount.fuse.weightfs ]; then
	skip "mount -t through mount.fuse3: /sbin/mount.fuse.weightfs is installed, mount(8) runs it instead"
elif [ "$found" != /usr/bin/weightfs ]; then
	skip "mount -t through mount.fuse3: $found comes before /usr/bin/weightfs on the shell's default PATH"
else
	reaped fuse3 mount -t fuse.weightfs "$S" "$M" -o nosync,nofail,_netdev
	expect "mount.fuse3: mount -t fuse.weightfs STORE MNT -o nosync,nofail,_netdev: exit 0" 0
	got=$(mounted "$M")
	[[ $got == "fuse.weightfs $S "* ]]
	verdict "mount.fuse3: mounted as fuse.weightfs from STORE" $? "mountinfo: $got"
	args=$(daemon_args "$S")
	# mount.fuse3 adds dev,suid and drops nofail and _netdev.
	if [[ $args == "weightfs $S $M -o rw,nosync,dev,suid " ]]; then
		ok "mount.fuse3: ran 'weightfs STORE MNT -o rw,nosync,dev,suid' from the default PATH"
	else
		fail "mount.fuse3: ran 'weightfs STORE MNT -o rw,nosync,dev,suid' from the default PATH" \
			"daemon: ${args:-none running}"
	fi
	expect_io mount.fuse3 "$M"
	expect_umount mount.fuse3 "$M"
	expect_daemon_exit fuse3 mount.fuse3
	expect_clean mount.fuse3 "$S"
fi

# ---- mount -t fuse.weightfs through mount.fuse.weightfs -----------------------------------------------
if ! $have_overlay || ! overlay "$SBIN" "$ROOT/usr/sbin"; then
	skip "mount.fuse.weightfs: overlayfs is not available to put it in /sbin: helper route untested"
	have_overlay=false
fi
HELPER=/sbin/mount.fuse.weightfs
if $have_overlay; then
	S=$work/store-helper M=$work/mnt-helper
	mkdir -p "$M"
	reaped helper mount -t fuse.weightfs "$S" "$M" -o nosync,nofail,_netdev,x-systemd.requires=foo.mount
	expect "helper: mount -t fuse.weightfs STORE MNT -o nosync,nofail,_netdev,x-...: exit 0" 0
	got=$(mounted "$M")
	[[ $got == "fuse.weightfs $S "* ]]
	verdict "helper: mounted as fuse.weightfs from STORE" $? "mountinfo: $got"
	# The helper runs the weightfs installed with it; mount(8)'s and systemd's options stay behind.
	args=$(daemon_args "$S")
	if [[ $args == "/usr/bin/weightfs $S $M -o rw,nosync " ]]; then
		ok "helper: ran '/usr/bin/weightfs STORE MNT -o rw,nosync'"
	else
		fail "helper: ran '/usr/bin/weightfs STORE MNT -o rw,nosync'" "daemon: ${args:-none running}"
	fi
	[[ " ${got##* }," == *,nosuid,nodev,* ]]
	verdict "helper: nosuid,nodev (libfuse's default for root)" $? "mountinfo: $got"
	expect_io helper "$M"
	for i in $(seq 20); do printf '%s' "$i" >"$M/f$i"; done
	expect_umount helper "$M"
	# umount(8) ran umount.fuse.weightfs: it returns once the daemon has closed the store.
	flock -n "$S/lock" true
	verdict "helper: umount returns after the daemon let go of STORE/lock (umount.fuse.weightfs)" $?
	expect_daemon_exit helper helper
	expect_clean helper "$S"

	# mount -f ("fake") and -v as mount(8) passes them; -t as it passes it to a helper under another name.
	run "$HELPER" "$S" "$M" -f -v -o rw,nosync,nofail
	expect "helper -f -v: exit 0, says what it would run" 0 "" \
		"^mount.fuse.weightfs: would run: /usr/bin/weightfs $S $M -o rw,nosync\$"
	! mounted "$M" >/dev/null
	verdict "helper -f: mounts nothing" $?
	run "$HELPER" "$S" "$M" -o nosync -t ext4
	expect "helper -t ext4: exit 1" 1 "" "this helper mounts fuse.weightfs only"
	run "$HELPER" "$S" "$M" -o nosync -t fuse.weightfs
	expect "helper -t fuse.weightfs: exit 0" 0
	mounted "$M" >/dev/null
	verdict "helper -t fuse.weightfs: mounted" $?
	mounted "$M" >/dev/null && expect_umount "helper -t" "$M"
	expect_clean "helper -t" "$S"
fi

# ---- mount -T with a private fstab ------------------------------------------------------------------
S=$work/store-fstab M=$work/mnt-fstab
mkdir -p "$M"
printf '%s %s fuse.weightfs defaults,nosync,passthrough=auto,nofail,x-systemd.requires-mounts-for=%s 0 0\n' \
	"$S" "$M" "$work" >"$work/fstab"
if ! $have_overlay; then
	skip "mount -T: without overlayfs, mount(8) cannot reach this build"
else
	reaped fstab mount -T "$work/fstab" "$M"
	expect "mount -T FSTAB MNT (defaults,nosync,passthrough=auto,nofail,x-systemd.*): exit 0" 0
	got=$(mounted "$M")
	[[ $got == "fuse.weightfs $S "* ]]
	verdict "mount -T: mounted as fuse.weightfs from STORE" $? "mountinfo: $got"
	args=$(daemon_args "$S")
	[[ $args == *" -o rw,nosync,passthrough=auto"* && $args != *nofail* && $args != *x-systemd* ]]
	verdict "mount -T: weightfs got rw,nosync,passthrough=auto" $? "daemon: ${args:-none running}"
	expect_io "mount -T" "$M"

	# A busy mount point: umount fails and the daemon stays (systemd retries at shutdown).
	exec {fd}<"$M/t"
	run umount "$M"
	if [ "$rc" -ne 0 ] && mounted "$M" >/dev/null && [ -n "$(daemon_pids "$S")" ]; then
		ok "mount -T: umount of a busy mount fails, mount and daemon stay"
	else
		fail "mount -T: umount of a busy mount fails, mount and daemon stay" "umount exit $rc: $err"
	fi
	exec {fd}<&-
	expect_umount "mount -T" "$M"
	expect_daemon_exit fstab "mount -T"
	expect_clean "mount -T" "$S"
fi

# ---- SIGTERM: what the last stage of a shutdown sends ------------------------------------------------
S=$work/store-term M=$work/mnt-term
mkdir -p "$M"
reaped term mount -t fuse.weightfs "$S" "$M" -o nosync
expect "SIGTERM: mount -t fuse.weightfs: exit 0" 0
if mounted "$M" >/dev/null; then
	printf 'sealed' >"$M/done"
	# A writer that has written and not closed: its version is never sealed. And a descriptor open.
	{
		printf 'half'
		exec sleep 60
	} >"$M/partial" &
	wpid=$!
	exec {fd}>"$M/other"
	for ((i = 0; i < 50; i++)); do
		[ -s "$M/partial" ] && break
		sleep 0.1
	done
	# Every process of the mount, as the shutdown's last stage does: the holder and its server
	# (either alone would do: the holder passes SIGTERM on).
	mapfile -t pids < <(daemon_pids "$S")
	kill -TERM "${pids[@]}"
	expect_daemon_exit term "SIGTERM with a file being written"
	! mounted "$M" >/dev/null
	verdict "SIGTERM: the daemon unmounts" $? "$(mounted "$M")"
	# Daemon-served, a write on a descriptor still open fails (ENOTCONN); written through
	# passthrough (a `>` create), the kernel takes it into the version's file, which nothing seals:
	# the next mount must not show it.
	late_write=0
	if { printf 'more' >&"$fd"; } 2>/dev/null; then
		late_write=1
	fi
	ok "SIGTERM: a write on a descriptor still open fails or goes nowhere (checked at the next mount)"
	exec {fd}>&-
	kill "$wpid"
	wait "$wpid" 2>/dev/null
	expect_clean SIGTERM "$S"
	reaped term2 mount -t fuse.weightfs "$S" "$M" -o nosync
	# The version being written is dropped: the name is gone, or keeps what was sealed before (empty).
	if [ "$rc" -eq 0 ] && [ "$(cat "$M/done" 2>/dev/null)" = sealed ] &&
		[ "$(cat "$M/partial" 2>/dev/null)" != half ] &&
		{ [ "$late_write" -eq 0 ] || [ "$(cat "$M/other" 2>/dev/null)" != more ]; }; then
		ok "SIGTERM: the next mount has the sealed files, not the bytes never sealed"
	else
		fail "SIGTERM: the next mount has the sealed files, not the bytes never sealed" \
			"mount exit $rc: $err" "$(ls -l "$M" 2>&1)"
	fi
	mounted "$M" >/dev/null && expect_umount "SIGTERM remount" "$M"
	expect_daemon_exit term2 "SIGTERM remount"
fi

# In the foreground (-f: systemd's Type=simple, or a terminal), SIGTERM and SIGHUP give exit 0 too.
# (Not SIGINT: a non-interactive shell starts background jobs with SIGINT ignored.)
for sig in TERM HUP; do
	S=$work/store-fg$sig M=$work/mnt-fg$sig
	mkdir -p "$M"
	"$B/weightfs" "$S" "$M" -f -o nosync 2>"$work/fg.stderr" &
	pid=$!
	for ((i = 0; i < 100; i++)); do
		mounted "$M" >/dev/null && break
		sleep 0.1
	done
	# Answered once the daemon serves requests (a signal while libfuse still runs its mtab helper
	# during the mount makes the mount fail instead).
	stat "$M" >/dev/null
	kill -"$sig" "$pid"
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -KILL "$pid"
		echo "(still running 10 s after SIG$sig: killed)" >>"$work/fg.stderr"
	fi
	wait "$pid"
	rc=$?
	if [ "$rc" -eq 0 ] && ! mounted "$M" >/dev/null; then
		ok "weightfs -f, SIG$sig: exit 0, unmounted"
	else
		fail "weightfs -f, SIG$sig: exit 0, unmounted" "exit $rc" "stderr: $(<"$work/fg.stderr")"
	fi
	grep -q "unmounting $M" "$work/fg.stderr"
	verdict "weightfs -f, SIG$sig: logs one line" $? "stderr: $(<"$work/fg.stderr")"
done

# ---- systemd: an fstab line, the units it becomes, the commands they run -------------------------------
gen=
for g in /usr/lib/systemd/system-generators/systemd-fstab-generator \
	/lib/systemd/system-generators/systemd-fstab-generator; do
	[ -x "$g" ] && gen=$g && break
done
analyze=$(command -v systemd-analyze || true)
# verify NAME UNITFILE [--man=no]: systemd-analyze verify passes without a warning; it also checks
# that the man pages in Documentation= exist, against the installed ones, unless --man=no.
verify() {
	if [ -z "$analyze" ]; then
		skip "$1: systemd-analyze verify (systemd-analyze is not installed)"
		return
	fi
	if [ "${3:-}" != --man=no ] && command -v man >/dev/null && [ -d "$ROOT/usr/share/man" ]; then
		run env MANPATH="$ROOT/usr/share/man" "$analyze" verify "$2"
	else
		run "$analyze" verify --man=no "$2"
	fi
	if [ "$rc" -eq 0 ] && ! grep -Eqi 'unknown|ignoring|refusing|bad' <<<"$err"; then
		ok "$1: systemd-analyze verify passes"
	else
		fail "$1: systemd-analyze verify passes" "exit $rc" "stderr: $err"
	fi
}
# unit_key FILE KEY: the value of KEY= in the unit FILE.
unit_key() {
	sed -n "s/^$2=//p" "$1" | head -n 1
}

S=$work/store-systemd M=$work/mnt-systemd
mkdir -p "$M"
if [ -z "$gen" ] || ! command -v systemd-escape >/dev/null; then
	skip "systemd: systemd-fstab-generator is not installed: the fstab line's unit is untested"
else
	gdir=$work/generated
	mkdir -p "$gdir"
	printf '%s %s fuse.weightfs allow_other,nofail,nosync,x-systemd.requires-mounts-for=%s 0 0\n' \
		"$S" "$M" "$work" >"$work/fstab.systemd"
	printf '%s %s fuse.weightfs nofail,_netdev 0 0\n' "$work/store-net" "$work/mnt-net" >>"$work/fstab.systemd"
	run env SYSTEMD_FSTAB="$work/fstab.systemd" SYSTEMD_LOG_LEVEL=warning "$gen" "$gdir" "$gdir" "$gdir"
	expect "systemd-fstab-generator on the fstab lines: exit 0" 0
	u=$(systemd-escape -p --suffix=mount "$M")
	unit=$gdir/$u
	if [ -f "$unit" ] && [ "$(unit_key "$unit" What)" = "$S" ] && [ "$(unit_key "$unit" Where)" = "$M" ] &&
		[ "$(unit_key "$unit" Type)" = fuse.weightfs ]; then
		ok "systemd: the fstab line becomes $u (What=STORE, Where=MNT, Type=fuse.weightfs)"
	else
		fail "systemd: the fstab line becomes $u (What=STORE, Where=MNT, Type=fuse.weightfs)" \
			"$(ls "$gdir")" "$(cat "$unit" 2>&1)"
	fi
	[ "$(unit_key "$unit" RequiresMountsFor)" = "$work" ]
	verdict "systemd: x-systemd.requires-mounts-for=DIR: RequiresMountsFor=DIR (after the store's disk)" $? \
		"$(cat "$unit")"
	# fuse.weightfs is local to systemd (it drops "fuse." and knows no network filesystem "weightfs").
	[ -L "$gdir/local-fs.target.wants/$u" ] && ! find "$gdir" -path '*remote-fs*' -name "$u" | grep -q .
	verdict "systemd: a local mount, wanted by local-fs.target (nofail)" $? "$(find "$gdir" -type l)"
	un=$(systemd-escape -p --suffix=mount "$work/mnt-net")
	[ -L "$gdir/remote-fs.target.wants/$un" ]
	verdict "systemd: with _netdev, a remote mount (remote-fs.target)" $? "$(find "$gdir" -type l)"
	verify "systemd: generated $u" "$unit" --man=no # Documentation=man:fstab(5), systemd's

	# What systemd runs to start and stop the unit: mount WHAT WHERE -t TYPE -o OPTIONS (less nofail,
	# noauto, auto), then umount WHERE -c.
	opts=$(unit_key "$unit" Options | tr , '\n' | grep -vxE 'nofail|noauto|auto' | paste -sd , -)
	reaped systemd mount "$(unit_key "$unit" What)" "$(unit_key "$unit" Where)" \
		-t "$(unit_key "$unit" Type)" -o "$opts"
	expect "systemd: the unit's mount command (mount WHAT WHERE -t fuse.weightfs -o $opts): exit 0" 0
	mounted "$M" >/dev/null
	verdict "systemd: mounted" $? "stderr: $err"
	expect_io systemd "$M"
	expect_umount systemd "$M" -c
	expect_daemon_exit systemd systemd
	expect_clean systemd "$S"
fi

# The example unit: valid, named after its Where=, and its options mount a store.
ex=$ROOT/usr/share/doc/weightfs/examples/$UNIT
if [ -f "$ex" ]; then
	verify "example $UNIT" "$ex"
	if command -v systemd-escape >/dev/null; then
		[ "$(systemd-escape -p --suffix=mount "$(unit_key "$ex" Where)")" = "$UNIT" ]
		verdict "example unit: named after its Where=" $? "Where=$(unit_key "$ex" Where)"
	fi
	S=$work/store-example M=$work/mnt-example
	mkdir -p "$M"
	opts=$(unit_key "$ex" Options | tr , '\n' | grep -vxE 'nofail|noauto|auto' | paste -sd , -)
	reaped example mount "$S" "$M" -t "$(unit_key "$ex" Type)" -o "$opts"
	expect "example unit: its Type= and Options= ($opts) mount a store: exit 0" 0
	mounted "$M" >/dev/null && expect_umount example "$M" -c
	expect_daemon_exit example "example unit"
else
	fail "example unit: $ex is installed"
fi

# ---- weightfsctl stage: a progress line on a terminal, nothing otherwise ------------------------------
# It stages a file from a mount whose daemon is stopped for 2 s (the open waits for it), so the batch
# is still running when the line is due (after 1 s).
S=$work/store-stage M=$work/mnt-stage
mkdir -p "$M"
if "$B/weightfs" "$S" "$M" -o nosync && head -c 4194304 /dev/urandom >"$M/w" && umount "$M" &&
	flock -w 10 "$S/lock" true; then
	"$B/weightfs" "$S" "$M" -f -o nosync,passthrough=off 2>/dev/null &
	spid=$!
	for ((i = 0; i < 100; i++)); do
		mounted "$M" >/dev/null && break
		sleep 0.1
	done
	run "$CTL" stage --host "$M/w"
	expect "stage --host, stderr not a terminal: exit 0" 0 "^staged 1 files, 4194304 bytes"
	[ -z "$err" ]
	verdict "stage --host, stderr not a terminal: no progress line" $? "stderr: $err"
	if command -v script >/dev/null; then
		stat "$M/w" >/dev/null # stage's stat finds the attributes cached: its open is what waits
		kill -STOP "$spid"
		script -qec "$CTL stage --host $M/w" /dev/null >"$work/stage.tty" 2>&1 &
		tpid=$!
		sleep 2
		kill -CONT "$spid"
		for ((i = 0; i < 100; i++)); do
			kill -0 "$tpid" 2>/dev/null || break
			sleep 0.1
		done
		wait "$tpid"
		rc=$?
		tty=$(tr '\r' '\n' <"$work/stage.tty")
		[ "$rc" -eq 0 ] && grep -Eq '^.\[Kstage: 0\.0/4\.0 MiB \(0%\), 0\.00 GB/s' <<<"$tty" &&
			grep -q '^.\[Kstaged 1 files, 4194304 bytes' <<<"$tty"
		verdict "stage --host on a terminal: a progress line while it waits, erased before the result" $? \
			"exit $rc" "output: $(cat -v "$work/stage.tty")"
	else
		skip "stage on a terminal: script(1) is not installed"
	fi
	umount "$M"
	wait "$spid"
else
	fail "stage: make a store with a 4 MiB file"
fi

# ---- a dead mount (the daemon killed with SIGKILL): refused with the command that clears it -----------
S=$work/store-dead M=$work/mnt-dead
mkdir -p "$M"
"$B/weightfs" "$S" "$M" -f -o nosync 2>/dev/null &
pid=$!
for ((i = 0; i < 100; i++)); do
	mounted "$M" >/dev/null && break
	sleep 0.1
done
stat "$M" >/dev/null
kill -KILL "$pid"
wait "$pid" 2>/dev/null
run "$B/weightfs" "$S" "$M" -o nosync
expect "dead mount: weightfs STORE MNT again: exit 1, names the command that clears it" 1 "" \
	"^weightfs: $M: a dead mount .*; clear it with: fusermount3 -u $M \(if that says busy, .*fusermount3 -uz $M"
n=$(awk -v m="$M" '$5 == m' /proc/self/mountinfo | wc -l)
[ "$n" -eq 1 ]
verdict "dead mount: no second mount stacked on it" $? "$n mounts on $M"
run fusermount3 -u "$M"
expect "dead mount: the printed command clears it" 0
if ! mounted "$M" >/dev/null && "$B/weightfs" "$S" "$M" -o nosync; then
	expect_io "dead mount: cleared, mounted again" "$M"
	grep -q "was not closed by its last owner (pid $pid, mounted on $M): killed" "$S/weightfs.log"
	verdict "dead mount: the next mount logs that the killed daemon did not close the store" $? \
		"$(tail -n 3 "$S/weightfs.log")"
	expect_umount "dead mount: remount" "$M"
	expect_clean "dead mount" "$S"
	if "$B/weightfs" "$S" "$M" -o nosync; then
		expect_umount "dead mount: a mount after a clean unmount" "$M"
		flock -w 10 "$S/lock" true
		n=$(grep -c "was not closed by its last owner" "$S/weightfs.log")
		[ "$n" -eq 1 ]
		verdict "dead mount: a mount after a clean unmount says nothing of it" $? "$n lines"
	else
		fail "dead mount: a mount after a clean unmount"
	fi
else
	fail "dead mount: cleared, mounted again" "$(mounted "$M")"
fi

# ---- a store whose disk is absent: not made on the filesystem below -------------------------------------
# The fstab mounts a disk on D, absent now (a boot without it): a mount of D/store, or of D itself, must
# not lay out a new store on the root filesystem. WFS_FSTAB stands in for /etc/fstab. Once something
# is mounted on D, the store is made as before; weightfsctl init makes one on purpose either way.
D=$work/disk M=$work/mnt-absent
mkdir -p "$D" "$M"
printf 'UUID=0a1b2c3d-absent %s ext4 defaults,nofail 0 2\n' "$D" >"$work/fstab.absent"
for S in "$D/store" "$D"; do
	run env WFS_FSTAB="$work/fstab.absent" "$B/weightfs" "$S" "$M" -o nosync
	expect "absent disk: weightfs $S: exit 1, names the fstab line and weightfsctl init" 1 "" \
		"^weightfs: $S: no store here, and not making one: the fstab mounts UUID=0a1b2c3d-absent on $D, which is not mounted now.*weightfsctl init $S\$"
	[ -z "$(ls -A "$D")" ] && ! mounted "$M" >/dev/null
	verdict "absent disk: weightfs $S left $D empty and mounted nothing" $? "$(ls -A "$D")"
done
if mount -t tmpfs -o size=64m wfs-test-disk "$D"; then
	if env WFS_FSTAB="$work/fstab.absent" "$B/weightfs" "$D/store" "$M" -o nosync; then
		expect_io "absent disk: its disk mounted, weightfs D/store makes the store there" "$M"
		expect_umount "absent disk: mounted" "$M"
	else
		fail "absent disk: its disk mounted, weightfs D/store makes the store there"
	fi
	umount "$D"
else
	skip "absent disk: cannot mount a tmpfs on $D"
fi
run env WFS_FSTAB="$work/fstab.absent" "$CTL" init "$D/store"
expect "absent disk: weightfsctl init makes the store on purpose" 0
[ -e "$D/store/catalog.db" ]
verdict "absent disk: weightfsctl init laid it out" $? "$(ls -A "$D/store" 2>&1)"
rm -rf "$D/store"

# ---- a daemon without CAP_SYS_ADMIN: passthrough off from the mount on ----------------------------------
# The kernel hands backing files only to CAP_SYS_ADMIN (a user's own mount through fusermount3): stat
# said "on" until the first open failed. A test point stands in for the missing capability.
S=$work/store-nocap M=$work/mnt-nocap
mkdir -p "$M"
if WFS_FAULT=init.cap-sys-admin=EPERM:0 "$B/weightfs" "$S" "$M" -o nosync; then
	pt=$("$B/weightfsctl" stat "$M" | sed -n 's/^passthrough: *//p')
	[[ $pt == off* ]]
	verdict "no CAP_SYS_ADMIN: weightfsctl stat says passthrough off before any open" $? "passthrough: $pt"
	grep -q "passthrough needs CAP_SYS_ADMIN" "$S/weightfs.log"
	verdict "no CAP_SYS_ADMIN: the log says why" $? "$(tail -n 3 "$S/weightfs.log")"
	printf 'served' >"$M/f" && [ "$(cat "$M/f")" = served ] && ! grep -q "passthrough open failed" "$S/weightfs.log"
	verdict "no CAP_SYS_ADMIN: the daemon serves writes and reads, no open tries passthrough" $?
	expect_umount "no CAP_SYS_ADMIN" "$M"
else
	fail "no CAP_SYS_ADMIN: mount"
fi

# ---- a store is private to the mounting user ----------------------------------------------------------
# $work (mktemp, 0700) is opened for traversal so that only the store's own modes keep others out.
S=$work/store-private M=$work/mnt-private
mkdir -p "$S" "$M"
chmod 711 "$work"
chmod 755 "$S" # an empty directory as mkdir(1) makes it: the new store in it is made private anyway
asnobody=()
if command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
	asnobody=(setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups)
fi
if [ ${#asnobody[@]} -eq 0 ]; then
	skip "private store: setpriv(1) or user nobody is missing"
elif ! "$B/weightfs" "$S" "$M" -o nosync,allow_other; then
	fail "private store: mount a new store with allow_other"
else
	printf 'public' >"$M/public" && chmod 644 "$M/public"
	printf 'secret' >"$M/secret" && chmod 600 "$M/secret"
	mode=$(stat -c %a "$S")
	[ "$mode" = 700 ]
	verdict "private store: a new store's directory is 0700" $? "mode $mode"
	nfiles=0 readable=
	while IFS= read -r -d '' f; do
		nfiles=$((nfiles + 1))
		if "${asnobody[@]}" cat "$f" >/dev/null 2>"$work/stderr" ||
			! grep -q 'Permission denied' "$work/stderr"; then
			readable="$readable ${f#"$S"/}"
		fi
	done < <(find "$S" -type f -print0)
	nobj=$(find "$S/objects" -type f | wc -l)
	[ -z "$readable" ] && [ "$nobj" -ge 2 ] && [ -f "$S/catalog.db" ]
	verdict "private store: user nobody cannot read any of its $nfiles files ($nobj objects, catalog.db)" $? \
		"readable:${readable:- none}" "objects: $nobj"
	got=$("${asnobody[@]}" cat "$M/public" 2>&1)
	[ "$got" = public ] && ! "${asnobody[@]}" cat "$M/secret" >/dev/null 2>&1
	verdict "private store: through the mount, others read by each file's mode (0644 yes, 0600 no)" $? \
		"public: $got"
	expect_umount "private store" "$M"
	flock -w 10 "$S/lock" true
	# An existing store that others can enter: mounted, with a warning that says how to close it.
	chmod 755 "$S"
	run "$B/weightfs" "$S" "$M" -o nosync
	expect "open store: mounts, warns on stderr with the fix" 0 "" \
		"the store can be entered by other users \(mode 0755\).*make it private with: chmod 700 $S\$"
	grep -q "warning\]: $S: the store can be entered by other users" "$S/weightfs.log"
	verdict "open store: the warning is in STORE/weightfs.log" $? "$(tail -n 3 "$S/weightfs.log")"
	mounted "$M" >/dev/null && expect_umount "open store" "$M"
fi
chmod 700 "$work"

# ---- a store on XFS: versions start as reflinks -------------------------------------------------------
# A rewrite of a sealed file starts as a reflink of its object (FICLONE) where the store's filesystem
# shares extents (fs/core/version.c): on XFS a 1-byte change of a 64 MiB tensor whose old version a
# reader still holds costs kilobytes of disk, where ext4 copies the 64 MiB. On a loop-mounted image.
X=$work/xfs S=$work/xfs/store M=$work/xfs-mnt
if ! command -v mkfs.xfs >/dev/null; then
	skip "a store on XFS: mkfs.xfs is missing (Debian package xfsprogs)"
elif ! { truncate -s 1G "$work/xfs.img" && mkfs.xfs -q -m reflink=1 "$work/xfs.img" && mkdir -p "$X" "$M" &&
	mount -o loop "$work/xfs.img" "$X"; } 2>/dev/null; then
	skip "a store on XFS: the loop mount of an XFS image failed (no loop devices here?)"
else
	head -c $((64 << 20)) /dev/urandom >"$work/t.old"
	if "$B/weightfs" "$S" "$M" -o nosync && cp "$work/t.old" "$M/t" && sync; then
		exec 9<"$M/t" # a reader of the sealed version
		used0=$(df -B1 --output=used "$X" | tail -n 1)
		printf X | dd of="$M/t" bs=1 seek=4096 conv=notrunc status=none
		sync
		used1=$(df -B1 --output=used "$X" | tail -n 1)
		cmp -s "$work/t.old" - <&9
		verdict "a store on XFS: the reader of the old version keeps its bytes" $?
		[ "$(dd if="$M/t" bs=1 skip=4096 count=1 status=none)" = X ] && cmp -s -i 4097 "$work/t.old" "$M/t"
		verdict "a store on XFS: the name reads the changed bytes" $?
		[ $((used1 - used0)) -lt $((4 << 20)) ]
		verdict "a store on XFS: the 1-byte change of 64 MiB shares its extents (disk use +$((used1 - used0)) bytes)" $?
		exec 9<&-
		expect_umount "a store on XFS" "$M"
		flock -w 10 "$S/lock" true
	else
		fail "a store on XFS: mount and write" "$(tail -n 3 "$S/weightfs.log" 2>/dev/null)"
	fi
	umount "$X"
fi

# ---- make uninstall ----------------------------------------------------------------------------------
# Daemons run /usr/bin/weightfs from the overlay: let the last ones finish exiting first.
for ((i = 0; i < 100; i++)); do
	[ -z "$(daemon_pids "$work")" ] && break
	sleep 0.1
done
for ((i = ${#overlays[@]} - 1; i >= 0; i--)); do
	"$work/umount" "${overlays[i]}" || fail "umount the overlay on ${overlays[i]}" "$(daemon_pids "$work")"
done
overlays=()
run mk uninstall DESTDIR="$ROOT" PREFIX=/usr
expect "make uninstall PREFIX=/usr DESTDIR=...: exit 0" 0
expect_uninstalled "make uninstall PREFIX=/usr" "$ROOT"

echo "mount: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
