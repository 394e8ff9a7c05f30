#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# weightfsctl exit codes and messages (stat, fsck, gc, safetensors import/export, usage errors) on a
# store made through a real mount. Root only (FUSE). Prints one ok/FAIL line per check and closes
# with "cli: N passed, N failed".
#   usage: tests/cli/test_cli.sh BUILD_DIR
set -uo pipefail

if [ $# -ne 1 ]; then
	echo "usage: $0 BUILD_DIR" >&2
	exit 2
fi
B=$(cd "$1" && pwd) || exit 2
CTL=$B/weightfsctl
DAEMON=$B/weightfs
for bin in "$CTL" "$DAEMON"; do
	if [ ! -x "$bin" ]; then
		echo "cli: $bin is missing (run make all)" >&2
		exit 1
	fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/wfs-cli.XXXXXX") || exit 1
STORE=$work/store
MNT=$work/mnt
cleanup() {
	local m
	for m in "$MNT" "$work/hmnt" "$work/smnt"; do
		if mountpoint -q "$m" 2>/dev/null; then
			fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null
		fi
	done
	mountpoint -q "$work/bind-store" 2>/dev/null && umount "$work/bind-store"
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. "$(dirname "$0")/../lib/check.sh" # ok, fail, skip, verdict, run, expect
. "$(dirname "$0")/../lib/mount.sh" # wfs_python_lib

# json_num KEY: the value of top-level KEY of the JSON in $out (empty when absent, or not JSON).
json_num() {
	python3 -c 'import json, sys; v = json.loads(sys.argv[1]).get(sys.argv[2]); print("" if v is None else v)' \
		"$out" "$1" 2>/dev/null
}

# expect_json NAME KEY VALUE: the last run's JSON has "KEY": VALUE (numbers compared as numbers).
expect_json() {
	local got
	got=$(json_num "$2")
	if [ -n "$got" ] && awk -v a="$got" -v b="$3" 'BEGIN { exit !(a == b) }'; then
		ok "$1"
	else
		fail "$1" "\"$2\": '$got', want $3" "stdout: $out"
	fi
}

# timed_run CMD...: run, and its wall time in $ms (milliseconds).
ms=0
timed_run() {
	local t0
	t0=$(date +%s%N)
	run "$@"
	ms=$((($(date +%s%N) - t0) / 1000000))
}

# ---- a store made through a real mount -----------------------------------------------------------
mkdir -p "$STORE" "$MNT" || exit 1
# retain keeps released objects for the offline gc below (the daemon would delete them at once).
if ! "$DAEMON" "$STORE" "$MNT" -o nosync,retain=1G; then
	echo "cli: cannot mount $STORE on $MNT" >&2
	echo "cli: 0 passed, 1 failed"
	exit 1
fi
if ! mountpoint -q "$MNT"; then
	echo "cli: $MNT is not a mount point after weightfs returned" >&2
	echo "cli: 0 passed, 1 failed"
	exit 1
fi

# Two names of one 1 MiB object (dedup), a 4 KiB file, a 100-byte file in a subdirectory, and a file
# removed again (an unreferenced object, kept by the retention budget).
fill() { head -c "$2" /dev/zero | tr '\0' "$1"; }
if ! { fill a 1048576 >"$MNT/a" && cp "$MNT/a" "$MNT/b" && fill c 4096 >"$MNT/c" && mkdir "$MNT/sub" &&
	fill d 100 >"$MNT/sub/d" && fill e 200 >"$MNT/e" && rm "$MNT/e"; }; then
	fail "write files through the mount"
fi
names=4
logical=$((2 * 1048576 + 4096 + 100))
objects=3
object_bytes=$((1048576 + 4096 + 100))
ratio4=$(awk -v l="$logical" -v o="$object_bytes" 'BEGIN { printf "%.4f", l / o }')
ratio2=$(awk -v l="$logical" -v o="$object_bytes" 'BEGIN { printf "%.2f", l / o }')

# ---- stat ------------------------------------------------------------------------------------------
run "$CTL" stat "$MNT"
expect "stat MNT" 0 "^store: +$STORE\$"
for pair in "names:=$names" "logical bytes:=$logical" "objects:=$objects" "physical bytes:=$object_bytes" \
	"dedup ratio:=${ratio2}x"; do
	key=${pair%%=*} val=${pair#*=}
	if grep -Eq "^$key +$val( |\$)" <<<"$out"; then
		ok "stat MNT: $key $val"
	else
		fail "stat MNT: $key $val" "stdout: $out"
	fi
done

run "$CTL" stat --json "$MNT"
expect "stat --json MNT" 0 '^\{"store": ".*\}$'
expect_json "stat --json: names" names "$names"
expect_json "stat --json: directories" directories 2
expect_json "stat --json: logical_bytes" logical_bytes "$logical"
expect_json "stat --json: objects" objects "$objects"
expect_json "stat --json: object_bytes" object_bytes "$object_bytes"
expect_json "stat --json: unreferenced_bytes" unreferenced_bytes 200
expect_json "stat --json: dedup_ratio" dedup_ratio "$ratio4"
unreferenced=$(json_num unreferenced_objects)
if command -v python3 >/dev/null; then
	if python3 -c 'import json, sys; json.load(sys.stdin)' <<<"$out" 2>/dev/null; then
		ok "stat --json is valid JSON"
	else
		fail "stat --json is valid JSON" "stdout: $out"
	fi
fi
run "$CTL" stat --json "$STORE"
expect_json "stat --json STORE: same logical_bytes" logical_bytes "$logical"
run "$CTL" stat "$MNT"
expect "stat MNT: opens counted as read-only passthrough opens and daemon opens, not one total" 0 \
	"^opens since mount: +[0-9]+ read-only through passthrough, [0-9]+ by the daemon \(writes, or reads without passthrough\)\$"
expect "stat MNT: tensor writes through passthrough and copies sealed, on a line of their own" 0 \
	"^tensor writes: +[0-9]+ through passthrough \([0-9]+ sealed from a copy: the file was still writable at its release; [0-9]+ sealed on their writer's declared digest, [0-9]+ of those checked since\)\$"
expect "stat MNT: the request threads' counts" 0 \
	"^request threads: +[1-9][0-9]* requests found while polling \(-o spin=50 us\), [0-9]+ after sleeping; [0-9]+ hand-overs"

# A subtree of the mount: its own totals, read through the mount.
cp "$MNT/sub/d" "$MNT/sub/d2" && mkdir "$MNT/sub/deeper" && fill c 4096 >"$MNT/sub/deeper/c"
run "$CTL" stat "$MNT/sub"
expect "stat MNT/DIR: exit 0, names the subtree" 0 "^subtree: +$MNT/sub "
for pair in "names:=3" "directories:=2" "logical bytes:=4296" "objects:=2" "physical bytes:=4196" \
	"dedup ratio:=1.02x"; do
	key=${pair%%=*} val=${pair#*=}
	if grep -Eq "^$key +$val( |\$)" <<<"$out"; then
		ok "stat MNT/DIR: $key $val"
	else
		fail "stat MNT/DIR: $key $val" "stdout: $out"
	fi
done
run "$CTL" stat --json "$MNT/sub/deeper"
expect_json "stat --json MNT/DIR: names" names 1
expect_json "stat --json MNT/DIR: object_bytes" object_bytes 4096
# An entry that cannot be read (a path past PATH_MAX here) is left out and counted, as du(1) does:
# the totals of the rest, a message, exit 1 (was: no totals at all).
python3 -c '
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
for i in range(20):
    os.mkdir("d" * 250, dir_fd=fd)
    nfd = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = nfd
os.mkdir("deepest", dir_fd=fd)
' "$MNT/sub/deeper"
run "$CTL" stat "$MNT/sub/deeper"
expect "stat MNT/DIR with an entry past PATH_MAX: exit 1, totals of the rest, says what it left out" 1 \
	"^names: +1\$" "1 entries could not be read and are left out \(first: .*: File name too long\)\$"
rm -r "$MNT/sub/d2" "$MNT/sub/deeper"
run "$CTL" stat "$work/no-such-dir"
expect "stat of a missing path: exit 1, says so" 1 "" "no-such-dir: No such file or directory\$"
mkdir -p "$work/plain-dir"
run "$CTL" stat "$work/plain-dir"
expect "stat of a directory that is no store: exit 1" 1 "" "plain-dir: not a weightfs store"

# ---- a container that sees the mount but not the store ------------------------------------------
# A private mount namespace with a tmpfs over STORE: the mount is there, the store's path names an
# empty directory. stat said "catalog.db is missing" (data loss, it seemed), cache and fsck named a
# missing object or store, weightfs.evict raised FileNotFoundError (found by a new user). Each now
# says the store is not visible from there, and what to do; stat prints the daemon's totals.
# in_container CMD...: CMD in a new mount namespace where STORE is hidden under a tmpfs.
in_container() {
	# shellcheck disable=SC2016 # expanded by the inner bash, from its own arguments
	unshare -m --propagation private bash -c 'mount -t tmpfs none "$1" && shift && exec "$@"' bash "$STORE" "$@"
}
hidden_re="the store $STORE is not visible from this mount namespace \(a container that sees the mount only\): [a-z ]+ needs the store's directory; bind-mount it into the container at the same path, or run this on the host\$"
if in_container true 2>/dev/null; then
	run in_container "$CTL" stat "$MNT"
	expect "container without the store: stat prints the daemon's totals, says the store is not visible" 0 \
		"^store: +$STORE \(not visible from this mount namespace: totals from the daemon"
	grep -Eq "^names: +$names\$" <<<"$out" && grep -q "^server: " <<<"$out" &&
		! grep -q "catalog.db is missing\|catalog.db missing" <<<"$out$err"
	verdict "container without the store: stat's totals are the daemon's, no catalog.db is missing" $? \
		"stdout: $out" "stderr: $err"
	run in_container "$CTL" stat --json "$MNT"
	expect "container without the store: stat --json says store_visible false" 0 '"store_visible": false'
	run "$CTL" stat --json "$MNT"
	expect "stat --json on the host: store_visible true" 0 '"store_visible": true'
	for args in "cache status $MNT/a" "cache drop $MNT/a" "fsck $MNT" "gc $MNT"; do
		# shellcheck disable=SC2086 # $args: a subcommand and its operands, split on purpose
		run in_container "$CTL" $args
		expect "container without the store: weightfsctl $args: exit 1, says so" 1 "" "$hidden_re"
	done
	pylib=$(wfs_python_lib "$B")
	if [ -f "$pylib" ]; then
		run in_container env PYTHONPATH="$(dirname "$0")/../../lib/python" WEIGHTFS_LIB="$pylib" \
			python3 -c 'import errno, sys, weightfs
try:
    weightfs.evict([sys.argv[1]])
except OSError as e:
    print(type(e).__name__, errno.errorcode.get(e.errno), e)
    sys.exit(3)' "$MNT/a"
		expect "container without the store: weightfs.evict raises OSError EREMOTE that says so" 3 \
			"^OSError EREMOTE .*$hidden_re"
	else
		fail "container without the store: weightfs.evict" "$pylib is missing (run make all)"
	fi
else
	skip "container without the store: unshare -m cannot make a mount namespace here"
fi

# Mounting the store a second time: refused at once (a daemon that serves a mount does not let go
# of its store: no wait for it), naming the daemon that has it and where.
mkdir -p "$work/mnt2"
timed_run "$DAEMON" "$STORE" "$work/mnt2" -o nosync
expect "mount a mounted store again: exit 1, names the pid and mount point" 1 "" \
	"in use by another weightfs process \(pid [0-9]+, mounted on $MNT\)\$"
[ "$ms" -lt 1000 ]
verdict "mount a mounted store again: refused in under 1 s (${ms} ms)" $? "it took $ms ms"
pid=$(sed -nE 's/.*\(pid ([0-9]+),.*/\1/p' <<<"$err")
[ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = weightfs ] && ! mountpoint -q "$work/mnt2"
verdict "mount a mounted store again: the pid is the daemon's, nothing mounted" $? "pid '$pid'" "stderr: $err"
# A lazily unmounted daemon still serving an open file holds its store: the refusal says so.
LS=$work/lazy-store LM=$work/lazy-mnt
mkdir -p "$LM"
if "$DAEMON" "$LS" "$LM" -o nosync && echo x >"$LM/f"; then
	exec 8<"$LM/f"
	fusermount3 -uz "$LM"
	run "$DAEMON" "$LS" "$LM" -o nosync
	expect "mount of a store whose daemon was lazily unmounted: exit 1, says it is detached" 1 "" \
		"it is no longer mounted: a lazy unmount \(fusermount3 -uz, umount -l\) detached it, and it exits once the last file still open through it is closed\$"
	exec 8<&-
	flock -w 10 "$LS/lock" true
	mountpoint -q "$LM" && fusermount3 -u "$LM"
else
	fail "lazy unmount: mount and write"
fi
# The mounted store through another path (a bind mount of it): refused as through its own path. It
# waited 5 s and then said a lazy unmount had detached the daemon (no mount of that path string),
# and stat of that path showed no daemon (found by a new user): the store is known by its inode now.
BS=$work/bind-store
mkdir -p "$BS"
if mount --bind "$STORE" "$BS"; then
	timed_run "$DAEMON" "$BS" "$work/mnt2" -o nosync
	expect "mount a mounted store through a bind path: exit 1, names the pid and mount point" 1 "" \
		"in use by another weightfs process \(pid [0-9]+, mounted on $MNT\)\$"
	! grep -q "lazy unmount\|no longer mounted" <<<"$err" && [ "$ms" -lt 1000 ] && ! mountpoint -q "$work/mnt2"
	verdict "mount through a bind path: no lazy-unmount claim, refused in under 1 s (${ms} ms)" $? \
		"stderr: $err"
	run "$CTL" stat "$BS"
	expect "stat of the store through a bind path: shows the daemon's section" 0 "^server: +pid [0-9]+ "
	run "$CTL" stat --json "$BS"
	expect "stat --json of the store through a bind path: has the daemon" 0 '"daemon": \{'
	umount "$BS"
else
	skip "mount through a bind path: mount --bind failed here"
fi
# Two mounts on one mount point would stack; a mount point given as STORE is a swap.
run "$DAEMON" "$work/store-b" "$MNT" -o nosync
expect "mount on a live weightfs mount: exit 1, says unmount" 1 "" "already a weightfs mount \(of $STORE\); unmount it first: fusermount3 -u "
run "$DAEMON" "$MNT" "$work/mnt2" -o nosync
expect "a weightfs mount point as STORE: exit 1, arguments look swapped" 1 "" "not a store: the arguments look swapped"
# A store inside a weightfs mount deadlocked both daemons (found by a new user); one inside another
# store would be taken for that store's files.
run "$DAEMON" "$MNT/nested-store" "$work/mnt2" -o nosync
expect "a store inside a weightfs mount: exit 1, says so" 1 "" \
	"inside the weightfs mount [^ ]+ \(of [^ ]+\): a store must live outside any mount of one\$"
run "$DAEMON" "$STORE/tmp/nested" "$work/mnt2" -o nosync
expect "a store inside another store: exit 1, says so" 1 "" \
	"inside the weightfs store [^ ]+: a store must live outside any other\$"
# A mount that fails after the store was made for it (libfuse's mount(2), /dev/fuse refused; here
# the fault point "mount"): the new store goes again, an existing one stays.
WFS_FAULT=mount=EACCES run "$DAEMON" "$work/made-for-nothing" "$work/mnt2" -o nosync
[ "$rc" = 1 ] && [ ! -e "$work/made-for-nothing" ]
verdict "a mount that fails removes the store it made" $? "rc $rc; $(ls -la "$work/made-for-nothing" 2>&1)"
"$CTL" init "$work/kept" >/dev/null && echo x >"$work/kept/other-file"
WFS_FAULT=mount=EACCES run "$DAEMON" "$work/kept" "$work/mnt2" -o nosync
[ -e "$work/kept/catalog.db" ] && [ -e "$work/kept/other-file" ]
verdict "a mount that fails keeps a store that was there" $? "$(ls -la "$work/kept" 2>&1)"
# objects/ removed by hand: the store mounts (nothing more is lost), and says so at once (it said
# nothing before; found by a new operator); the name reads EIO.
"$CTL" init "$work/gone" >/dev/null && "$DAEMON" "$work/gone" "$work/mnt2" -o nosync &&
	echo content >"$work/mnt2/f" && fusermount3 -u "$work/mnt2" && flock -w 10 "$work/gone/lock" true
rm -rf "$work/gone/objects"
run "$DAEMON" "$work/gone" "$work/mnt2" -o nosync
expect "a store whose objects/ was removed: mounts, says the contents are gone" 0 "" \
	"objects was missing \(made again, empty\): the 1 contents the catalog lists are gone"
! cat "$work/mnt2/f" 2>/dev/null
verdict "a store whose objects/ was removed: its name reads EIO" $?
fusermount3 -u "$work/mnt2" && flock -w 10 "$work/gone/lock" true
# catalog.db removed by hand while mounted: the daemon's open catalog holds the names, and the
# unmount writes them there again (every name was lost before; found by a new operator).
"$CTL" init "$work/rmcat" >/dev/null && "$DAEMON" "$work/rmcat" "$work/mnt2" -o nosync &&
	mkdir "$work/mnt2/d" && echo one >"$work/mnt2/d/f1" && rm "$work/rmcat/catalog.db" &&
	echo two >"$work/mnt2/f2" && fusermount3 -u "$work/mnt2" && flock -w 10 "$work/rmcat/lock" true
grep -q "catalog $work/rmcat/catalog.db was removed or replaced while in use: the names it held are written there again" \
	"$work/rmcat/weightfs.log" && "$DAEMON" "$work/rmcat" "$work/mnt2" -o nosync &&
	[ "$(cat "$work/mnt2/d/f1" "$work/mnt2/f2")" = "$(printf 'one\ntwo')" ]
verdict "catalog.db removed while mounted: the unmount writes the names there again" $? \
	"$(tail -n 3 "$work/rmcat/weightfs.log")"
fusermount3 -u "$work/mnt2" && flock -w 10 "$work/rmcat/lock" true
run "$CTL" fsck "$work/rmcat"
expect "catalog.db removed while mounted: fsck finds nothing after" 0
# A mount point inside the store would hide its objects/ (fsck then saw strays and missing objects).
run "$DAEMON" "$STORE" "$STORE/objects" -o nosync
expect "a mount point inside the store: exit 1, says so" 1 "" \
	"the mount point is inside the store $STORE: the mount would hide the store's own files\$"
# A comma (or backslash) in the store path is escaped for libfuse's -o fsname (it was taken for the
# start of another option, after the store had been made).
mkdir -p "$work/mnt,c"
if "$DAEMON" "$work/st,ore" "$work/mnt,c" -o nosync && printf c >"$work/mnt,c/f" &&
	[ "$(cat "$work/mnt,c/f")" = c ] && "$CTL" stat "$work/mnt,c" | grep -q "^store: *$work/st,ore\$"; then
	ok "a store path with a comma mounts, and stat names it"
else
	fail "a store path with a comma mounts, and stat names it"
fi
mountpoint -q "$work/mnt,c" && fusermount3 -u "$work/mnt,c"
# Directly in the other store, not yet made: the first mount made it, every later one refused it.
run "$DAEMON" "$STORE/inner/" "$work/mnt2" -o nosync
expect "a new store directly inside another store (trailing slash): exit 1, says so" 1 "" \
	"inside the weightfs store $STORE: a store must live outside any other\$"
[ ! -e "$MNT/nested-store" ] && [ ! -e "$STORE/tmp/nested" ] && [ ! -e "$STORE/inner" ]
verdict "refused nested stores made nothing" $? "$(ls -la "$MNT" "$STORE" "$STORE/tmp")"
if [ -e "$work/store-b" ] || mountpoint -q "$work/mnt2"; then
	fail "refused mounts made nothing" "$(ls -la "$work")"
else
	ok "refused mounts made nothing"
fi

# ---- fsck and gc while mounted --------------------------------------------------------------------
run "$CTL" fsck "$MNT"
expect "fsck MNT (mounted): read-only check, exit 0" 0 \
	"^fsck: $STORE \(mounted: read-only check\): [0-9]+ objects .* checked; 0 problems, 0 repaired, 0 left\$"
run "$CTL" fsck --repair "$MNT"
expect "fsck --repair MNT (mounted): exit 1, says unmount" 1 "" "^weightfsctl fsck: $STORE: mounted: unmount it"
# --json: a check that ran prints its report; one that failed prints none (it printed {"store": ...,
# "findings": []} before its error, which a monitoring script took for a clean store).
run "$CTL" fsck --json "$MNT"
expect "fsck --json MNT (mounted): the report, state mounted, exit 0" 0 \
	'^\{"store": ".*", "findings": \[\], "online": true, "state": "mounted", .*"problems_left": 0\}$'
run "$CTL" fsck --json --repair "$MNT"
expect "fsck --json --repair MNT (mounted): exit 1, says unmount" 1 "" "^weightfsctl fsck: $STORE: mounted: unmount it"
verdict "fsck --json --repair MNT (mounted): nothing on stdout" "$([ -z "$out" ]; echo $?)" "stdout: $out"
# Mounted, gc asks the daemon (user.weightfs.gc); a budget of 1G keeps what the offline gc below removes.
# The store is found busy at once: its daemon serves a mount (it waited 5 s for it to let go).
timed_run "$CTL" gc --retain 1G "$MNT"
expect "gc --retain 1G MNT (mounted): its daemon collects, exit 0" 0 \
	"^gc: $STORE: removed 0 unreferenced objects \(0\.0 MiB\); kept [1-9][0-9]* .* \(by its daemon: mounted\)\$"
[ "$ms" -lt 1000 ]
verdict "gc MNT (mounted): done in under 1 s (${ms} ms)" $? "it took $ms ms"
timed_run "$CTL" gc --quarantine "$MNT"
expect "gc --quarantine MNT (mounted): exit 1, names the daemon, says unmount" 1 "" \
	"^weightfsctl gc: .*--quarantine: the store is in use by weightfs \(pid [0-9]+, mounted on $MNT\): unmount it first"
[ "$ms" -lt 1000 ]
verdict "gc --quarantine MNT (mounted): refused in under 1 s (${ms} ms)" $? "it took $ms ms"

# ---- unmount, damage one object -------------------------------------------------------------------
fusermount3 -u "$MNT" || fail "fusermount3 -u $MNT"
# The daemon exits just after the unmount: wait for it to let go of the store.
flock -w 10 "$STORE/lock" true || fail "daemon still holds $STORE/lock 10 s after unmount"

obj=$(find "$STORE/objects" -type f -size 4096c)
if [ -z "$obj" ] || [ "$(wc -l <<<"$obj")" -ne 1 ]; then
	fail "find the 4096-byte object" "found: '$obj'"
	obj=/nonexistent/00/0000
fi
hex=$(basename "$(dirname "$obj")")$(basename "$obj")
if ! { chmod 0644 "$obj" && printf 'X' | dd of="$obj" bs=1 seek=100 conv=notrunc status=none &&
	chmod 0444 "$obj"; }; then
	fail "damage object $hex"
fi

run "$CTL" fsck "$STORE"
expect "fsck STORE (damaged): exit 1, names the digest" 1 "^corrupt +$hex: "
expect "fsck STORE (damaged): summary" 1 "^fsck: $STORE: [0-9]+ objects .* checked; 1 problems, 0 repaired, 1 left\$"

run "$CTL" fsck --repair "$STORE"
# Its names still fail: not repaired, left, exit 1, as the next check says (it said "1 repaired,
# 0 left" and exit 0, so `fsck --repair && mount` mounted names that fail with EIO).
expect "fsck --repair STORE: quarantines, names still fail: exit 1" 1 \
	"^corrupt +$hex: .*; moved to quarantine/; 1 names fail with EIO until the content is written again\$"
expect "fsck --repair STORE: summary honest, says what is left and why" 1 \
	"^fsck: $STORE: [0-9]+ objects .* checked; 1 problems, 0 repaired, 1 left; 1 in quarantine\$"
expect "fsck --repair STORE: only writing the content again heals it" 1 \
	"^fsck: left: 1 objects whose names fail with EIO .*only writing the content again heals them"
if [ -f "$STORE/quarantine/$hex" ] && [ ! -e "$obj" ]; then
	ok "fsck --repair: object moved to quarantine/$hex"
else
	fail "fsck --repair: object moved to quarantine/$hex" "$(ls -R "$STORE/quarantine" "$STORE/objects" 2>&1)"
fi

run "$CTL" fsck "$STORE"
expect "fsck STORE after repair: exit 1 (missing, quarantined)" 1 "^missing +$hex: .*quarantined"
others=$(grep -Ev "^(missing +$hex|quarantined +quarantine/$hex|clean +lock|fsck): |^ +/" <<<"$out")
if [ -z "$others" ] && grep -Eq "1 problems, 0 repaired, 1 left; 1 in quarantine\$" <<<"$out"; then
	ok "fsck STORE after repair: nothing else left"
else
	fail "fsck STORE after repair: nothing else left" "stdout: $out"
fi
run "$CTL" fsck --json "$STORE"
expect "fsck --json STORE: problems_left 1" 1 '"problems_left": 1\}$'

# ---- gc ----------------------------------------------------------------------------------------------
# The default budget is 0: "remove them all" (gc --help).
run "$CTL" gc --dry-run --json "$STORE"
expect "gc --dry-run: exit 0" 0 '"dry_run": true'
expect_json "gc --dry-run: bytes_removed" bytes_removed 200
would=$(json_num objects_removed)
run "$CTL" gc --dry-run "$STORE"
expect "gc --dry-run: says would remove" 0 "^gc: $STORE: would remove ${would:-?} unreferenced objects"
run "$CTL" stat --json "$STORE"
expect_json "gc --dry-run removed nothing" unreferenced_objects "$unreferenced"

run "$CTL" gc "$STORE"
expect "gc: removes what the dry run said" 0 "^gc: $STORE: removed ${would:-?} unreferenced objects"
run "$CTL" stat --json "$STORE"
expect_json "gc (retain 0): no unreferenced objects left" unreferenced_objects 0
expect_json "gc: named objects untouched" objects "$objects"
run "$CTL" gc --json "$STORE"
expect_json "gc again: nothing to remove" objects_removed 0
run "$CTL" gc --quarantine --dry-run "$STORE"
expect "gc --quarantine --dry-run: counts the damaged copy, keeps it" 0 "^gc: $STORE: would remove 1 quarantined copies"
[ -e "$STORE/quarantine/$hex" ] || fail "gc --quarantine --dry-run removed quarantine/$hex"
run "$CTL" gc --quarantine --json "$STORE"
expect_json "gc --quarantine: removes the damaged copy" quarantined_removed 1
if [ -z "$(ls -A "$STORE/quarantine")" ]; then
	ok "gc --quarantine: quarantine/ is empty"
else
	fail "gc --quarantine: quarantine/ is empty" "$(ls -A "$STORE/quarantine")"
fi
run "$CTL" fsck "$STORE"
expect "fsck after gc --quarantine: the name still fails (missing), nothing quarantined left" 1 "^missing +$hex: "

# ---- fsck right after an unmount ----------------------------------------------------------------------
# fusermount3 -u returns before the daemon has let go of the store; fsck --repair waits for it (up
# to 5 s) instead of calling the store mounted. WFS_DELAY holds the daemon 1.5 s after the unmount.
XSTORE=$work/xstore XMNT=$work/xmnt
mkdir -p "$XMNT"
if WFS_DELAY=daemon.exit=1500 "$B/weightfs" "$XSTORE" "$XMNT" && printf 'x' >"$XMNT/f"; then
	fusermount3 -u "$XMNT"
	run "$CTL" fsck --repair "$XSTORE"
	expect "fsck --repair right after fusermount3 -u: waits for the daemon, checks offline" 0 \
		"^fsck: $XSTORE: [0-9]+ objects .* checked; 0 problems"
else
	fail "mount $XSTORE with a slow exit"
	fusermount3 -uz "$XMNT" 2>/dev/null
fi

# ---- usage errors and help ---------------------------------------------------------------------------
run "$CTL"
expect "weightfsctl (no command): exit 2" 2 "" "^usage: weightfsctl COMMAND"
run "$CTL" nope
expect "weightfsctl nope: exit 2" 2 "" "unknown command 'nope'"
run "$CTL" fsck
expect "weightfsctl fsck (no store): exit 2" 2 "" "^usage: weightfsctl fsck"
run "$CTL" gc --retain 12Q "$STORE"
expect "weightfsctl gc --retain 12Q: exit 2" 2 "" "--retain 12Q: not a size"
run "$CTL" fsck --rate 12Q "$STORE"
expect "weightfsctl fsck --rate 12Q: exit 2" 2 "" "--rate 12Q: not a size"
run "$CTL" stat
expect "weightfsctl stat (no store): exit 2" 2 "" "^usage: weightfsctl stat"
run "$CTL" fsck "$work/no-such-store"
expect "weightfsctl fsck (no such path): exit 1, says so" 1 "" "no-such-store: No such file or directory\$"
run "$CTL" fsck "$work/plain-dir"
expect "weightfsctl fsck (not a store): exit 1" 1 "" "not a weightfs store"
run "$CTL" gc "$work/plain-dir"
expect "weightfsctl gc (not a store): exit 1" 1 "" "not a weightfs store"
run "$CTL" --help
expect "weightfsctl --help: exit 0" 0 "^usage: weightfsctl COMMAND"
for sub in stat fsck gc stage; do
	run "$CTL" "$sub" --help
	expect "weightfsctl $sub --help: exit 0" 0 "^usage: weightfsctl $sub"
done
# Logical bytes are the sizes ls -l shows; du counts allocated blocks (holes left out), as
# weightfsctl(8) and docs/semantics.md say (--help said "what ls and du of the mount show").
run "$CTL" stat --help
[ "$rc" = 0 ] && grep -q "logical bytes (the sum of file sizes, what ls -l of the" <<<"$out" &&
	grep -q "du shows allocated blocks instead" <<<"$out" && ! grep -q "what ls and du" <<<"$out"
verdict "weightfsctl stat --help: logical bytes are what ls -l shows, not du" $? "stdout: $out"

# ---- one version: VERSION, for both binaries, the man pages and the Python package -----------------
version=$(cat "$(dirname "$0")/../../VERSION")
run "$DAEMON" --version
expect "weightfs --version: VERSION's ($version)" 0 "^weightfs $version \(libfuse "
run "$CTL" --version
expect "weightfsctl --version: VERSION's ($version)" 0 "^weightfsctl $version\$"
run env PYTHONPATH="$(dirname "$0")/../../lib/python" python3 -c 'import weightfs; print(weightfs.__version__)'
expect "weightfs.__version__: VERSION's ($version)" 0 "^$version\$"
run head -n 1 "$B/man/weightfs.8" "$B/man/weightfsctl.8"
[ "$(grep -c "^\.TH .* \"weightfs $version\" " <<<"$out")" -eq 2 ]
verdict "man pages built with VERSION's ($version)" $? "$out"

# ---- no CUDA runtime needed to start -----------------------------------------------------------
# Nothing links libcudart: lib/cudart.c loads it where GPU staging needs it, so a node without CUDA
# (or with another major version) mounts and runs weightfsctl; staging to a GPU then says why not.
for bin in "$DAEMON" "$CTL" "$B/libweightfs.so"; do
	run ldd "$bin"
	if [ "$rc" -eq 0 ] && ! grep -q 'libcuda' <<<"$out"; then
		ok "$(basename "$bin") links no CUDA library"
	else
		fail "$(basename "$bin") links no CUDA library" "ldd: $out $err"
	fi
done
printf 'tensor' >"$work/one.bin"
run env WFS_CUDART="$work/no-such-libcudart.so" "$CTL" stage "$work/one.bin"
expect "weightfsctl stage with no CUDA runtime: exit 1, names what it looked for" 1 "" \
	"^weightfsctl stage: (GPU staging is not available: cannot load the CUDA runtime \(WFS_CUDART\): $work/no-such-libcudart.so: cannot open|weightfs was not built with CUDA)"
run env WFS_CUDART="$work/no-such-libcudart.so" "$CTL" stage --host "$work/one.bin"
expect "weightfsctl stage --host with no CUDA runtime: exit 0" 0 "^staged 1 files, 6 bytes"

# ---- stage --offload: where each input goes; inputs that would share a destination ---------------
# A file given directly goes to DIR/its name, one found under a directory argument to DIR/its path
# below it. rank0/w and rank1/w (given directly, or found under rank0 and rank1) both went to DIR/w:
# exit 0, "offloaded 2 files", one file left, of mixed bytes (two workers wrote it at once).
SD=$work/stage-src
mkdir -p "$SD/rank0/sub" "$SD/rank1" "$SD/top"
head -c 9649640 /dev/urandom >"$SD/rank0/w" && head -c 3904052 /dev/urandom >"$SD/rank1/w" &&
	printf s >"$SD/rank0/sub/s" && printf t >"$SD/top/sub"
run "$CTL" stage --host --offload "$work/off1" "$SD/rank0/w" "$SD/rank1/w"
expect "stage --offload, two files of one name given directly: exit 2, names both" 2 "" \
	"^weightfsctl stage: --offload $work/off1: $SD/rank0/w and $SD/rank1/w would both be written to $work/off1/w; nothing staged or written"
run "$CTL" stage --host --offload "$work/off2" "$SD/rank0" "$SD/rank1/"
expect "stage --offload, directories with same-named files: exit 2, names both" 2 "" \
	"^weightfsctl stage: --offload $work/off2: $SD/rank0/w and $SD/rank1/w would both be written to $work/off2/w; nothing staged or written"
run "$CTL" stage --host --offload "$work/off3" "$SD/top/sub" "$SD/rank0"
expect "stage --offload, a file where another input needs a directory: exit 2, names both" 2 "" \
	"^weightfsctl stage: --offload $work/off3: $SD/top/sub would be written to $work/off3/sub, which $SD/rank0/sub/s needs as a directory; "
[ ! -e "$work/off1" ] && [ ! -e "$work/off2" ] && [ ! -e "$work/off3" ]
verdict "stage --offload refused: nothing written" $? "$(ls -lR "$work"/off? 2>&1)"
run "$CTL" stage --host --verify --offload "$work/off4" "$SD" "$SD/rank1/w"
expect "stage --offload of a directory and a file: exit 0, every file offloaded" 0 "^offloaded 5 files, 17457746 bytes"
cmp -s "$SD/rank0/w" "$work/off4/rank0/w" && cmp -s "$SD/rank1/w" "$work/off4/rank1/w" &&
	cmp -s "$SD/rank1/w" "$work/off4/w" && [ "$(cat "$work/off4/rank0/sub/s" "$work/off4/top/sub")" = st ] &&
	[ "$(find "$work/off4" -type f | wc -l)" = 5 ]
verdict "stage --offload: a directory's files under their path below it, a file under its name" $? \
	"$(ls -lR "$work/off4" 2>&1)"

# ---- the mount(8) helper ------------------------------------------------------------------------
# mount(8) and fstab hand it their own options too; they must not reach weightfs.
HELPER=$(cd "$(dirname "$0")/../.." && pwd)/mount-helpers/mount.fuse.weightfs
HSTORE=$work/hstore
HMNT=$work/hmnt
mkdir -p "$HMNT"
run env PATH="$B:$PATH" "$HELPER" "$HSTORE" "$HMNT" -o rw,nofail,_netdev,defaults,x-systemd.requires=foo.mount,nosync
expect "mount.fuse.weightfs with mount(8)/systemd options: exit 0" 0
if mountpoint -q "$HMNT" && printf 'tensor' >"$HMNT/t" && [ "$(cat "$HMNT/t")" = tensor ] &&
	grep -q " $HMNT fuse.weightfs " /proc/mounts; then
	ok "mount.fuse.weightfs: mounted as fuse.weightfs, reads back what was written"
else
	fail "mount.fuse.weightfs: not mounted or not working"
fi
fusermount3 -u "$HMNT" 2>/dev/null
run env PATH="$B:$PATH" "$HELPER" "$HSTORE"
expect "mount.fuse.weightfs without a mount point: exit 1" 1 "" "^usage: mount.fuse.weightfs"

# ---- safetensors import / export ------------------------------------------------------------------
# A store of its own; fixtures (valid, sharded, malformed) written by tests/lib/st_write.py in the
# reference implementation's layout, so export must give them back byte for byte.
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SSTORE=$work/sstore
SMNT=$work/smnt
FX=$work/fx
mkdir -p "$SSTORE" "$SMNT"
xattr() { getfattr --only-values -n "$1" "$2" 2>/dev/null; }
if ! python3 "$ROOT/tests/lib/st_write.py" fixtures "$FX"; then
	fail "safetensors: write the fixtures (python3 tests/lib/st_write.py)"
elif ! "$DAEMON" "$SSTORE" "$SMNT" -o nosync; then
	fail "safetensors: mount $SSTORE on $SMNT"
else
	run "$CTL" import "$FX/model.safetensors" "$SMNT/m"
	expect "import model.safetensors: exit 0" 0 "^import: 12 tensors .* into $SMNT/m\$"
	got=$(find "$SMNT/m" -type f | wc -l)
	if [ "$got" -eq 12 ]; then
		ok "import: one file per tensor (12)"
	else
		fail "import: one file per tensor" "found $got files"
	fi
	if [ "$(xattr user.weightfs.dtype "$SMNT/m/model.embed_tokens.weight")" = BF16 ] &&
		[ "$(xattr user.weightfs.shape "$SMNT/m/model.embed_tokens.weight")" = "[16,8]" ] &&
		[ "$(xattr user.weightfs.dtype "$SMNT/m/blocks/0/attn/qkv")" = I64 ] &&
		[ "$(xattr user.weightfs.shape "$SMNT/m/blocks/0/attn/qkv")" = "[3,2]" ] &&
		[ "$(xattr user.weightfs.shape "$SMNT/m/scalar")" = "[]" ] &&
		[ "$(xattr user.weightfs.shape "$SMNT/m/empty")" = "[0,4]" ]; then
		ok "import: dtype/shape xattrs, '/' in a name makes directories"
	else
		fail "import: dtype/shape xattrs" "$(getfattr -R -d "$SMNT/m" 2>&1 | head -n 20)"
	fi
	got=$(xattr user.weightfs.safetensors.metadata "$SMNT/m")
	if [ "$got" = '{"format":"pt"}' ]; then
		ok "import: __metadata__ kept on DIR"
	else
		fail "import: __metadata__ kept on DIR" "got '$got'"
	fi
	python3 - "$FX/model.safetensors" "$work/qproj" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
b, e = h["model.layers.0.self_attn.q_proj.weight"]["data_offsets"]; f.seek(8 + n + b)
open(sys.argv[2], "wb").write(f.read(e - b))
PY
	if cmp -s "$work/qproj" "$SMNT/m/model.layers.0.self_attn.q_proj.weight"; then
		ok "import: a tensor's bytes"
	else
		fail "import: a tensor's bytes differ from the checkpoint's"
	fi
	da=$(xattr user.weightfs.digest "$SMNT/m/lm_head.weight")
	db=$(xattr user.weightfs.digest "$SMNT/m/model.embed_tokens.weight")
	if [ -n "$da" ] && [ "$da" = "$db" ]; then
		ok "import: tied tensors share one object (dedup)"
	else
		fail "import: tied tensors share one object" "$da vs $db"
	fi

	run "$CTL" export "$SMNT/m" "$work/out.safetensors"
	expect "export: exit 0" 0 "^export: 12 tensors .* into $work/out.safetensors \([0-9]+ bytes\)\$"
	if cmp -s "$FX/model.safetensors" "$work/out.safetensors"; then
		ok "export: byte-identical to the imported file"
	else
		fail "export: differs from the imported file" "$(cmp "$FX/model.safetensors" "$work/out.safetensors" 2>&1)"
	fi
	run "$CTL" export "$SMNT/m" "$work/out.safetensors"
	expect "export onto an existing file: exit 1" 1 "" "out.safetensors: exists \(--force replaces it\)"
	run "$CTL" export --force --json "$SMNT/m" "$work/out.safetensors"
	expect "export --force --json: exit 0" 0 '^\{"dir": .*"tensors": 12, .*\}$'
	expect_json "export --json: file_bytes" file_bytes "$(stat -c %s "$FX/model.safetensors")"
	run "$CTL" import --json "$work/out.safetensors" "$SMNT/m2"
	expect_json "import --json: tensors" tensors 12
	if python3 -c 'import json, sys; json.load(sys.stdin)' <<<"$out" 2>/dev/null; then
		ok "import --json is valid JSON"
	else
		fail "import --json is valid JSON" "stdout: $out"
	fi
	run "$CTL" export "$SMNT/m2" "$work/out2.safetensors"
	if cmp -s "$work/out.safetensors" "$work/out2.safetensors"; then
		ok "export -> import -> export: byte-identical"
	else
		fail "export -> import -> export: byte-identical" "$err"
	fi

	# The same checkpoint again: nothing to replace (other content needs --force: test_store.sh).
	run "$CTL" import "$FX/model.safetensors" "$SMNT/m"
	expect "import over the same tensors: exit 0, unchanged" 0 "^import: 12 tensors .* \(unchanged: all there already\)\$"
	run "$CTL" import --force --json "$FX/model.safetensors" "$SMNT/m"
	expect_json "import --force of the same tensors: replaces none" replaced 0
	expect_json "import --force of the same tensors: 12 unchanged" unchanged 12
	if [ -z "$(find "$SMNT/m" -name '.wfs-tmp-*')" ]; then
		ok "import: no temporary names left"
	else
		fail "import: temporary names left" "$(find "$SMNT/m" -name '.wfs-tmp-*')"
	fi

	for f in nometa empty; do
		run "$CTL" import "$FX/$f.safetensors" "$SMNT/$f"
		run "$CTL" export "$SMNT/$f" "$work/$f.out"
		if cmp -s "$FX/$f.safetensors" "$work/$f.out"; then
			ok "import + export of $f.safetensors: byte-identical"
		else
			fail "import + export of $f.safetensors: byte-identical" "$err"
		fi
	done
	if [ -z "$(xattr user.weightfs.safetensors.metadata "$SMNT/nometa")" ] &&
		[ "$(xattr user.weightfs.safetensors.metadata "$SMNT/empty")" = "{}" ]; then
		ok "import: no __metadata__ and an empty one stay distinct"
	else
		fail "import: no __metadata__ and an empty one stay distinct"
	fi

	run "$CTL" import "$FX/sharded/model.safetensors.index.json" "$SMNT/s"
	expect "import sharded index: exit 0" 0 "^import: 12 tensors"
	got=$(xattr user.weightfs.safetensors.index "$SMNT/s")
	if [ "$got" = '{"total_size":939}' ]; then
		ok "import sharded: index metadata kept"
	else
		fail "import sharded: index metadata" "got '$got'"
	fi
	run "$CTL" export "$SMNT/s" "$work/s.safetensors"
	if cmp -s "$FX/model.safetensors" "$work/s.safetensors"; then
		ok "export of a sharded import: the unsharded file, byte-identical"
	else
		fail "export of a sharded import: the unsharded file" "$err"
	fi
	# A FrozenOffload rank directory: its manifest names the tensors (escaped file names such as
	# enc%2Fw for "enc/w"), and is not itself one.
	mkdir -p "$SMNT/rank0"
	printf '\1\2\3\4\5\6\7\10' >"$SMNT/rank0/enc%2Fw" && printf '\11\12' >"$SMNT/rank0/b"
	setfattr -n user.weightfs.dtype -v F32 "$SMNT/rank0/enc%2Fw" && setfattr -n user.weightfs.shape -v '[2]' "$SMNT/rank0/enc%2Fw"
	setfattr -n user.weightfs.dtype -v U8 "$SMNT/rank0/b" && setfattr -n user.weightfs.shape -v '[2]' "$SMNT/rank0/b"
	printf '%s' '{"params": {"enc/w": {"file": "enc%2Fw", "dtype": "F32", "shape": [2]}, "b": {"file": "b"}}, "version": 1}' \
		>"$SMNT/rank0/.weightfs-manifest.json"
	run "$CTL" export "$SMNT/rank0" "$work/rank0.safetensors"
	hdr=$(python3 -c 'import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
print(sorted(json.loads(b[8:8 + n])), b[8 + n:].hex())' "$work/rank0.safetensors" 2>&1)
	if [ "$rc" -eq 0 ] && [ "$hdr" = "['b', 'enc/w'] 0102030405060708090a" ]; then
		ok "export of a FrozenOffload rank: tensors named by the manifest's parameters, the manifest left out"
	else
		fail "export of a FrozenOffload rank directory" "rc $rc; got $hdr" "$err"
	fi
	printf '%s' '{"params": {"x": {"file": "../b"}}}' >"$SMNT/rank0/.weightfs-manifest.json"
	run "$CTL" export "$SMNT/rank0" "$work/rank0-bad.safetensors"
	expect "export of a rank whose manifest names a path: exit 1, says so" 1 "" 'parameter "x": "file" is not a file name of the directory'

	run "$CTL" import "$FX/sharded/wrong.safetensors.index.json" "$SMNT/w"
	expect "import sharded with a wrong weight_map: exit 1" 1 "" "is in model-00001-of-00002.safetensors, but the index maps it to model-00002-of-00002.safetensors"
	run "$CTL" import "$FX/sharded/ghost.safetensors.index.json" "$SMNT/w"
	expect "import sharded, a mapped tensor missing: exit 1" 1 "" "tensor 'ghost' is not in model-00001-of-00002.safetensors, where the index maps it\$"
	run "$CTL" import "$FX/sharded/partial.safetensors.index.json" "$SMNT/w"
	expect "import sharded, a tensor not in the map: exit 1" 1 "" "safetensors: tensor 'scalar' is not in the index's weight_map\$"
	if [ -e "$SMNT/w" ]; then
		fail "import sharded with a bad index: wrote nothing" "$SMNT/w exists"
	fi

	while read -r bad re; do
		run "$CTL" import "$FX/bad/$bad.safetensors" "$SMNT/bad-$bad"
		expect "import bad/$bad: exit 1, says why" 1 "" "^weightfsctl import: $FX/bad/$bad.safetensors: $re"
		if [ -e "$SMNT/bad-$bad" ]; then
			fail "import bad/$bad: wrote nothing" "$SMNT/bad-$bad exists"
		fi
	done <<'BAD'
short byte 0: file is 4 bytes, shorter than the 8-byte header length$
cut byte 0: header length 100 runs past the end of the file \(13 bytes\)$
huge byte 0: header length 1099511627776 is over the 100000000-byte limit$
badjson byte 29: invalid JSON: 
array byte 8: the header is a JSON array, not an object$
baddtype byte 22: tensor 'a': dtype 'F31' is not a safetensors dtype
subbyte byte 22: tensor 'a': dtype F4 has elements smaller than a byte
mismatch byte 62: tensor 'a.weight': data_offsets \[0, 10\] but F32 x \[3\] is 12 bytes$
overlap byte 106: tensor 'b': data_offsets \[4, 12\] overlap tensor 'a' \[0, 8\]$
hole byte 106: tensor 'b': data_offsets \[8, 12\] leave a hole: data bytes \[4, 8\) belong to no tensor$
tail byte 65: the last 2 bytes of the data buffer belong to no tensor
range byte 54: tensor 'a': data_offsets \[0, 8\] run past the data buffer \(4 bytes\)$
dup byte 64: invalid JSON: duplicate object key
negshape byte 35: tensor 'a': shape\[0\] is not a non-negative integer$
metanum byte 34: __metadata__ 'format': value is not a string$
dotdot tensor '\.\./evil': has a '\.\.' path component$
filedir tensor 'a' is also a directory of tensor 'a/b'$
BAD

	if ! { mkdir -p "$SMNT/raw" && printf 'not a tensor' >"$SMNT/raw/x"; }; then
		fail "write $SMNT/raw/x"
	fi
	run "$CTL" export "$SMNT/raw" "$work/raw.safetensors"
	expect "export of a file without dtype/shape: exit 1" 1 "" "raw/x: no user.weightfs.dtype/user.weightfs.shape xattrs: not a tensor \(--raw-ok"
	run "$CTL" export --raw-ok --json "$SMNT/raw" "$work/raw.safetensors"
	expect_json "export --raw-ok: the file as U8" raw_files 1
	if python3 - "$work/raw.safetensors" <<'PY'; then
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
sys.exit(0 if h == {"x": {"dtype": "U8", "shape": [12], "data_offsets": [0, 12]}} else 1)
PY
		ok "export --raw-ok: U8 [12]"
	else
		fail "export --raw-ok: U8 [12]"
	fi

	# --store: an unmounted store is mounted privately for the command, and unmounted after.
	mkdir -p "$work/pstore"
	run "$CTL" import --store "$work/pstore" "$FX/model.safetensors" models/m
	expect "import --store (unmounted): exit 0" 0 "^import: 12 tensors .* into $work/pstore:models/m\$"
	if [ -f "$work/pstore/catalog.db" ] && ! grep -q "^$work/pstore " /proc/mounts; then
		ok "import --store: store laid out, private mount gone"
	else
		fail "import --store: private mount left or no store"
	fi
	run "$CTL" export --store "$work/pstore" models/m "$work/p.safetensors"
	expect "export --store (unmounted): exit 0" 0
	if cmp -s "$FX/model.safetensors" "$work/p.safetensors"; then
		ok "export --store: byte-identical"
	else
		fail "export --store: byte-identical" "$err"
	fi
	run "$CTL" import --store "$SSTORE" "$FX/nometa.safetensors" via-store
	if [ "$rc" -eq 0 ] && [ -f "$SMNT/via-store/x" ]; then
		ok "import --store of a mounted store: through its mount"
	else
		fail "import --store of a mounted store" "exit $rc" "stderr: $err"
	fi
	run "$CTL" import --store "$FX" "$FX/model.safetensors"
	expect "import --store on a directory that is no store: exit 1" 1 "" "not a weightfs store"
	run "$CTL" import "$FX/model.safetensors" "$work/pstore/objects/evil"
	expect "import into a store's own objects/: exit 1, names the store" 1 "" \
		"inside the weightfs store $work/pstore itself"
	[ ! -e "$work/pstore/objects/evil" ]
	verdict "the refused import wrote nothing into the store" $?
	run "$CTL" export --store "$work/pstore" ../.. "$work/escape.safetensors"
	expect "export --store with a '..' DIR: exit 1" 1 "" "'\.\.' would leave the store"
	# The store lock is honoured: the private daemon cannot take a store another process holds.
	(exec 9>>"$work/pstore/lock" && flock -x 9 && exec sleep 30) &
	holder=$! # the sleep itself, holding the lock: killing it lets go
	sleep 0.2
	run "$CTL" import --store "$work/pstore" "$FX/nometa.safetensors" locked
	expect "import --store of a locked store: exit 1" 1 "" "did not mount it: .*in use by another weightfs process"
	kill "$holder" 2>/dev/null
	wait "$holder" 2>/dev/null

	# A plain directory works too (user xattrs on the backing filesystem).
	run "$CTL" import "$FX/model.safetensors" "$work/plain"
	run "$CTL" export "$work/plain" "$work/plain.safetensors"
	if cmp -s "$FX/model.safetensors" "$work/plain.safetensors"; then
		ok "import + export through a plain directory"
	else
		fail "import + export through a plain directory" "$err"
	fi

	run "$CTL" import "$work/no-such.safetensors" "$SMNT/x"
	expect "import of a missing file: exit 1" 1 "" "no-such.safetensors: No such file or directory"
	run "$CTL" import "$FX/model.safetensors"
	expect "import with one argument: exit 2" 2 "" "^usage: weightfsctl import"
	run "$CTL" export "$SMNT/m"
	expect "export with one argument: exit 2" 2 "" "^usage: weightfsctl export"
	run "$CTL" import --bogus "$FX/model.safetensors" "$SMNT/x"
	expect "import --bogus: exit 2" 2 "" "^usage: weightfsctl import"
	for sub in import export; do
		run "$CTL" "$sub" --help
		expect "weightfsctl $sub --help: exit 0" 0 "^usage: weightfsctl $sub"
	done
	fusermount3 -u "$SMNT" || fail "fusermount3 -u $SMNT"

	# A seal that fails (the 3rd new object's publish: ENOSPC) comes back from close(2): import
	# stops there, with the two tensors before it complete and nothing half-written under a name.
	if WFS_FAULT=publish.fdatasync=ENOSPC:3 "$DAEMON" "$work/fstore" "$SMNT" -o nosync; then
		run "$CTL" import "$FX/model.safetensors" "$SMNT/f"
		expect "import with a failing seal: exit 1, says ENOSPC" 1 "" "^weightfsctl import: $SMNT/f/model.layers.0.self_attn.q_proj.bias: No space left on device\$"
		got=$(find "$SMNT/f" -type f | sort | tr '\n' ' ')
		if [ "$got" = "$SMNT/f/blocks/0/attn/qkv $SMNT/f/scalar " ]; then
			ok "import with a failing seal: the tensors before it stay, no partial or temporary names"
		else
			fail "import with a failing seal: the tensors before it stay, no partial or temporary names" "found: $got"
		fi
		fusermount3 -u "$SMNT" || fail "fusermount3 -u $SMNT"
	else
		fail "mount $work/fstore with WFS_FAULT"
	fi
fi

# ---- a mount refused for its options leaves the store as it was ----------------------------------
# (a typo in an fstab line must not run recovery or retention: -o retain's kept objects stay)
RS=$work/rstore RM=$work/rmnt
mkdir -p "$RM"
if "$DAEMON" "$RS" "$RM" -o nosync,retain=1G; then
	head -c 100000 /dev/urandom >"$RM/kept" && rm "$RM/kept"
	fusermount3 -u "$RM" || fail "fusermount3 -u $RM"
	before=$(find "$RS/objects" -type f | wc -l)
	for o in retian=1G passthrough=maybe verify=always dedup_verify=yes passthrough=on sync,nosync \
		spin=20000 spin=-1 spin=5us \
		passthrough=auto,passthrough=off verify=open,verify=none dedup_verify=bytes,dedup_verify=digest holder,noholder \
		allow_other,allow_root auto_unmount passthrough=off,passthrough_writes=all \
		passthrough_writes=tensors,passthrough=off timeout=99999999999 timeout=nan timeout=-1; do
		run "$DAEMON" "$RS" "$RM" -o "$o"
		expect "weightfs -o $o: exit 2, says why" 2 "" "$o"
	done
	run "$DAEMON" "$RS" "$RM" -o nosync,no_such_option # libfuse's: it names the option, weightfs the help
	expect "weightfs -o no_such_option: exit 2, names the option" 2 "" "no_such_option"
	expect "weightfs -o no_such_option: says where the options are" 2 "" \
		"^weightfs: options refused; nothing mounted \(weightfs --help lists them\)$"
	after=$(find "$RS/objects" -type f | wc -l)
	if [ "$before" -eq 1 ] && [ "$after" -eq 1 ] && ! mountpoint -q "$RM"; then
		ok "refused options: the retained object is still there, nothing mounted"
	else
		fail "refused options: the retained object is still there, nothing mounted" "objects $before -> $after"
	fi
else
	fail "mount $RS with retain=1G"
fi

# ---- where a store is made: a missing or empty directory, or weightfsctl init ---------------------
# A directory that holds other files is refused as STORE and left as it was.
NS=$work/notstore NM=$work/nmnt
mkdir -p "$NS" "$NM"
printf 'my notes' >"$NS/notes.txt"
run "$DAEMON" "$NS" "$NM" -o nosync
expect "weightfs on a non-empty directory that is no store: exit 1, names weightfsctl init" 1 "" \
	"^weightfs: $NS: not a weightfs store .*and not empty: .*weightfsctl init $NS\$"
got=$(cd "$NS" && ls -A)
[ "$got" = notes.txt ] && ! mountpoint -q "$NM"
verdict "refused STORE: left exactly as it was, nothing mounted" $? "STORE holds: $got"
chmod 755 "$NS"
run "$CTL" init "$NS"
expect "weightfsctl init on a directory with files: exit 0" 0 "^init: $NS: a new weightfs store"
# The other users' access to those files goes with the 0700: said once, not silently.
expect "weightfsctl init on a directory with files: says its mode changed, from what to what" 0 \
	"^init: $NS: mode changed from 0755 to 0700: other users can no longer reach the files that were there\$"
if [ -f "$NS/catalog.db" ] && [ -d "$NS/objects" ] && [ "$(cat "$NS/notes.txt")" = 'my notes' ] &&
	[ "$(stat -c %a "$NS")" = 700 ]; then
	ok "weightfsctl init: catalog.db and objects/ laid out, STORE 0700, its files kept"
else
	fail "weightfsctl init: catalog.db and objects/ laid out, STORE 0700, its files kept" "$(ls -la "$NS")"
fi
run "$CTL" init "$NS"
expect "weightfsctl init on a store: exit 0, left as it is" 0 "already a weightfs store; left as it is"
! grep -q "mode changed" <<<"$out"
verdict "weightfsctl init on a store: no mode change to tell" $? "stdout: $out"
run "$CTL" init "$work/fresh-store"
[ "$rc" = 0 ] && ! grep -q "mode changed" <<<"$out" && [ "$(stat -c %a "$work/fresh-store")" = 700 ]
verdict "weightfsctl init of a new directory: made 0700, no mode change to tell" $? "rc $rc; stdout: $out"
if "$DAEMON" "$NS" "$NM" -o nosync && printf 'w' >"$NM/w" && [ "$(cat "$NM/w")" = w ]; then
	ok "a store made by weightfsctl init mounts"
else
	fail "a store made by weightfsctl init mounts"
fi
run "$CTL" init "$NM"
expect "weightfsctl init on a live mount point: exit 1, nothing written into the mount" 1 "" \
	"^weightfsctl init: $NM: a weightfs mount point \(of $NS\): a store must live outside"
run "$CTL" init "$NM/newsub"
expect "weightfsctl init of a new directory inside a mount: exit 1" 1 "" \
	"^weightfsctl init: $NM/newsub: inside the weightfs mount $NM "
got=$(ls -A "$NM")
[ "$got" = w ] && [ ! -e "$NS/newsub" ]
verdict "refused inits left the mount as it was" $? "the mount holds: $got"
mountpoint -q "$NM" && fusermount3 -u "$NM"
flock -w 10 "$NS/lock" true
run "$CTL" init "$NS/inner"
expect "weightfsctl init inside another store: exit 1, names it" 1 "" \
	"^weightfsctl init: $NS/inner: inside the weightfs store $NS: a store must live outside any other"
[ ! -e "$NS/inner" ]
verdict "weightfsctl init inside another store made nothing" $? "$(ls -la "$NS")"
run "$CTL" init "$work/no/such/parent"
expect "weightfsctl init with a missing parent: exit 1, names it" 1 "" \
	"its parent directory $work/no/such does not exist \(make it first: mkdir -p $work/no/such\)\$"
run "$DAEMON" "$work/no/such/parent" "$work/mnt2" -o nosync
expect "weightfs with a missing store parent: exit 1, names it" 1 "" \
	"cannot make the store: its parent directory $work/no/such does not exist"
run "$CTL" init
expect "weightfsctl init (no store): exit 2" 2 "" "^usage: weightfsctl init \[--retain SIZE\] STORE"
run "$CTL" init --help
expect "weightfsctl init --help: exit 0" 0 "^usage: weightfsctl init \[--retain SIZE\] STORE"

# Swapped arguments: weightfs MNT STORE must not hide the store under a mount, nor make a store in MNT.
SM=$work/swapmnt
mkdir -p "$SM"
run "$DAEMON" "$SM" "$NS" -o nosync
expect "weightfs MNT STORE (swapped): exit 1, says the arguments look swapped" 1 "" \
	"^weightfs: $NS: the mount point holds a weightfs store \(catalog.db\): the arguments look swapped"
[ -z "$(ls -A "$SM")" ] && ! mountpoint -q "$NS"
verdict "swapped arguments: nothing mounted, nothing written into MNT" $? "$(ls -A "$SM")"

# ---- a mount by a user other than root -------------------------------------------------------------
# As nobody, with a /dev/fuse that only root may open (mode 0600, as on the machine of the report):
# libfuse said only "fuse: failed to open /dev/fuse: Permission denied" (found by a new user), after
# the store had been made. weightfs says what such a mount needs, before it makes anything. Where
# nobody may open this machine's /dev/fuse, a 0600 node of the same device is bound over it in a
# private mount namespace.
if ! id nobody >/dev/null 2>&1; then
	skip "mount as nobody: no user nobody"
else
	NB=$work/nobody
	chmod 711 "$work"
	mkdir -p "$NB/mnt" "$NB/dev" && install -m 755 "$DAEMON" "$NB/weightfs" && chown nobody "$NB" "$NB/mnt"
	nobody_mount=(runuser -u nobody -- "$NB/weightfs" "$NB/store" "$NB/mnt" -o nosync)
	if ! runuser -u nobody -- test -r /dev/fuse -a -w /dev/fuse; then
		run "${nobody_mount[@]}"
	else
		fuse_dev="$((16#$(stat -c %t /dev/fuse))) $((16#$(stat -c %T /dev/fuse)))"
		# shellcheck disable=SC2016 # expanded by the inner bash, from its own arguments
		run unshare -m --propagation private bash -c 'mount -t tmpfs -o mode=755 none "$1" &&
			mknod -m 600 "$1/fuse" c $2 && mount --bind "$1/fuse" /dev/fuse || exit 99
			shift 2; exec "$@"' bash "$NB/dev" "$fuse_dev" "${nobody_mount[@]}"
	fi
	if [ "$rc" = 99 ]; then
		skip "mount as nobody: /dev/fuse lets nobody open it here, and no 0600 one could be bound over it"
	else
		expect "mount as nobody, /dev/fuse 0600: exit 1, says what a mount by a user needs" 1 "" \
			"^weightfs: cannot open /dev/fuse \(mode 0600, owner uid 0, group gid [0-9]+\): Permission denied: a mount by a user other than root needs read and write access to /dev/fuse .* and fusermount3 installed set-user-ID root; passthrough needs CAP_SYS_ADMIN, so such a mount serves reads and writes from the daemon"
		[ "$(wc -l <<<"$err")" -eq 1 ] && [ ! -e "$NB/store" ] && ! mountpoint -q "$NB/mnt"
		verdict "mount as nobody, /dev/fuse 0600: one line, no store made, nothing mounted" $? "stderr: $err" \
			"$(ls -la "$NB")"
	fi
fi

echo "cli: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
