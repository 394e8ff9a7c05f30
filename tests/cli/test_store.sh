#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What the store keeps, it keeps (issue 35): the retention budget is the store's and every mount
# honours it (plain remounts, weightfsctl's private mounts), a budget exceeded is logged. Root only
# (FUSE). Prints one ok/FAIL line per check and closes with "store: N passed, N failed".
#   usage: tests/cli/test_store.sh BUILD_DIR
set -uo pipefail

if [ $# -ne 1 ]; then
	echo "usage: $0 BUILD_DIR" >&2
	exit 2
fi
B=$(cd "$1" && pwd) || exit 2
CTL=$B/weightfsctl
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
for bin in "$CTL" "$B/weightfs"; do
	if [ ! -x "$bin" ]; then
		echo "store: $bin is missing (run make all)" >&2
		exit 1
	fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/wfs-store.XXXXXX") || exit 1
S=$work/store
M=$work/mnt
cleanup() {
	if mountpoint -q "$M" 2>/dev/null; then
		fusermount3 -u "$M" 2>/dev/null || fusermount3 -uz "$M" 2>/dev/null
	fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. "$ROOT/tests/lib/check.sh" # ok, fail, skip, verdict, run, expect
. "$ROOT/tests/lib/mount.sh" # wfs_mount, wfs_umount

# json_key KEY: the value of top-level KEY of the JSON in $out (empty when absent, or not JSON).
json_key() {
	python3 -c 'import json, sys; v = json.loads(sys.argv[1]).get(sys.argv[2]); print("" if v is None else v)' \
		"$out" "$1" 2>/dev/null
}
# expect_json NAME KEY VALUE: the last run's JSON has "KEY": VALUE.
expect_json() {
	local got
	got=$(json_key "$2")
	if [ "$got" = "$3" ]; then
		ok "$1"
	else
		fail "$1" "\"$2\": '$got', want $3" "stdout: $out" "stderr: $err"
	fi
}
# unreferenced: the store's count of objects no name uses (offline stat).
unreferenced() {
	run "$CTL" stat --json "$S"
	json_key unreferenced_objects
}
fill() { head -c "$2" /dev/zero | tr '\0' "$1"; }

# ---- 1. retention belongs to the store -----------------------------------------------------------
run "$CTL" init --retain 192K "$S"
expect "init --retain 192K: a new store" 0 "^init: $S: a new weightfs store"
run "$CTL" retain --json "$S"
expect_json "retain --json: the budget init recorded" retain_bytes 196608
run "$CTL" init --retain 1M "$S"
expect "init --retain 1M on that store: refused, names weightfsctl retain" 1 "" \
	"already a weightfs store, left as it is \(its retention budget: 196608 bytes\); change the budget with: weightfsctl retain $S SIZE"
run "$CTL" init --retain 192K "$S"
expect "init --retain 192K again: the same, exit 0" 0 "already a weightfs store; left as it is"

# Three 64 KiB objects, released one after another (a, b, c: a is the least recently released).
if wfs_mount "$B" "$S" "$M" -o nosync; then
	for x in a b c; do fill "$x" 65536 >"$M/$x"; done
	for x in a b c; do rm "$M/$x" && sleep 1.1; done # a second apart: released in that order
	run "$CTL" retain "$S" 1M
	expect "retain STORE SIZE while mounted: refused, says why" 1 "" \
		"in use by weightfs \(pid [0-9]+, mounted on $M\): a mount reads the budget when it mounts"
	wfs_umount "$M" || fail "unmount"
else
	fail "mount $S"
fi
verdict "a mount without -o retain keeps what the store's budget allows (3 objects)" \
	"$([ "$(unreferenced)" = 3 ]; echo $?)" "stat: $out"

if wfs_mount "$B" "$S" "$M" -o nosync; then
	wfs_umount "$M" || fail "unmount"
fi
verdict "a plain remount deletes nothing the store keeps" "$([ "$(unreferenced)" = 3 ]; echo $?)" "stat: $out"

FX=$work/fx
if python3 "$ROOT/tests/lib/st_write.py" fixtures "$FX" >/dev/null; then
	: >"$S/weightfs.log"
	run "$CTL" import --store "$S" "$FX/model.safetensors" m
	expect "import --store: exit 0" 0 "^import: 12 tensors"
	verdict "import --store: its private mount deletes nothing the store keeps" \
		"$([ "$(unreferenced)" = 3 ]; echo $?)" "stat: $out"
	if grep -Eq "weightfs\[info\]: $S mounted on .*/weightfsctl-import\.[^/]*/mnt" "$S/weightfs.log"; then
		ok "import --store: its private mount logs to the store's log"
	else
		fail "import --store: its private mount logs to the store's log" "$(cat "$S/weightfs.log")"
	fi
	run "$CTL" export --store "$S" m "$work/out.safetensors"
	expect "export --store: exit 0" 0
	verdict "export --store: its private mount deletes nothing the store keeps" \
		"$([ "$(unreferenced)" = 3 ]; echo $?)" "stat: $out"
else
	fail "write the safetensors fixtures (python3 tests/lib/st_write.py)"
fi

# A smaller budget given at mount is recorded, and what exceeds it goes, least recently released
# first, with an info line that counts it (routine: a rewrite past its budget collects at every
# release).
: >"$S/weightfs.log"
if wfs_mount "$B" "$S" "$M" -o nosync,retain=64K; then
	wfs_umount "$M" || fail "unmount"
fi
verdict "-o retain=64K: keeps one object" "$([ "$(unreferenced)" = 1 ]; echo $?)" "stat: $out"
if grep -Eq "weightfs\[info\]: retention: objects no name uses exceeded the store's budget of 65536 bytes: removed 2 objects \(131072 bytes\), least recently released first; kept 1 objects \(65536 bytes\)" \
	"$S/weightfs.log"; then
	ok "-o retain=64K: the removal is logged at info level with counts and bytes"
else
	fail "-o retain=64K: the removal is logged at info level with counts and bytes" "$(cat "$S/weightfs.log")"
fi
kept=$(find "$S/objects" -type f -size 64k -exec head -c 1 {} \; 2>/dev/null)
verdict "-o retain=64K: the one kept is the most recently released (c)" "$([ "$kept" = c ]; echo $?)" \
	"first byte of what is left: '$kept'"
run "$CTL" retain "$S"
expect "-o retain=64K is recorded for later mounts" 0 "^retain: $S: 65536 bytes "
run "$CTL" stat --prometheus "$S"
expect "stat --prometheus: weightfs_retain_bytes, the store's budget" 0 "^weightfs_retain_bytes\{store=\"$S\"\} 65536\$"
expect "stat --prometheus: weightfs_unreferenced_bytes" 0 "^weightfs_unreferenced_bytes\{store=\"$S\"\} 65536\$"
run "$CTL" stat --json "$S"
expect_json "stat --json: retain_bytes, the store's budget" retain_bytes 65536
run "$CTL" retain "$S" 0
expect "retain STORE 0: recorded" 0 "^retain: $S: 0 bytes .*was 65536 bytes"
run "$CTL" retain "$S" 12Q
expect "retain STORE 12Q: usage error" 2 "" "12Q: not a size"

# ---- 2. counts tell the truth: damaged copies on disk are counted until removed ---------------------
S2=$work/store2
if wfs_mount "$B" "$S2" "$M" -o nosync; then
	fill q 65536 >"$M/q"
	hex=$(getfattr --only-values -n user.weightfs.digest "$M/q" 2>/dev/null)
	wfs_umount "$M" || fail "unmount"
	obj=$S2/objects/${hex:0:2}/${hex:2}
	chmod u+w "$obj" && printf X | dd of="$obj" bs=1 seek=100 conv=notrunc status=none
	run "$CTL" fsck --repair "$S2"
	expect "fsck --repair: quarantines the damaged object (its name still fails: exit 1)" 1 \
		"^corrupt +$hex: .*moved to quarantine/"
	run "$CTL" stat --json "$S2"
	expect_json "stat --json, quarantined: the object" quarantined_objects 1
	expect_json "stat --json, quarantined: its damaged copy on disk" quarantine_files 1
	# Writing the content again heals the name; the damaged copy stays until gc --quarantine.
	if wfs_mount "$B" "$S2" "$M" -o nosync; then
		fill q 65536 >"$M/q2"
		cmp -s "$M/q" "$M/q2"
		verdict "written again: the quarantined name reads its bytes" $?
		wfs_umount "$M" || fail "unmount"
	fi
	run "$CTL" stat --json "$S2"
	expect_json "stat --json, healed: no object quarantined" quarantined_objects 0
	expect_json "stat --json, healed: the damaged copy still counted" quarantine_files 1
	expect_json "stat --json, healed: its bytes" quarantine_bytes 65536
	run "$CTL" stat "$S2"
	expect "stat, healed: the damaged copy on a line" 0 \
		"^quarantine/: +1 damaged copies, 65536 bytes on disk \(weightfsctl gc --quarantine removes them\)\$"
	run "$CTL" stat --prometheus "$S2"
	expect "stat --prometheus, healed: weightfs_quarantine_files 1" 0 "^weightfs_quarantine_files\{store=\"$S2\"\} 1\$"
	expect "stat --prometheus, healed: weightfs_quarantine_bytes 65536" 0 \
		"^weightfs_quarantine_bytes\{store=\"$S2\"\} 65536\$"
	if wfs_mount "$B" "$S2" "$M" -o nosync; then
		run "$CTL" stat --json "$M"
		expect_json "stat --json MNT (mounted): the damaged copy counted" quarantine_files 1
		daemon_q=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["daemon"]["quarantine_files"])' "$out" 2>/dev/null)
		verdict "stat --json MNT: the daemon counts it too" "$([ "$daemon_q" = 1 ]; echo $?)" "stdout: $out"
		wfs_umount "$M" || fail "unmount"
	fi
	run "$CTL" gc --quarantine "$S2"
	run "$CTL" stat --json "$S2"
	expect_json "gc --quarantine: nothing counted any more" quarantine_files 0
else
	fail "mount $S2"
fi

# ---- 3. importing the same tensors again succeeds; only other content needs --force -----------------
S3=$work/store3
mkdir -p "$work/ck"
python3 - "$ROOT/tests/lib" "$work/ck" <<'PY'
import struct, sys
sys.path.insert(0, sys.argv[1])
import st_write
d = sys.argv[2]
a = struct.pack("<4f", 1, 2, 3, 4)
b = struct.pack("<4f", 1, 2, 3, 5)
st_write.write(d + "/v1.safetensors", {"w": ("F32", [4], a), "sub/x": ("F32", [2, 2], a)}, {"format": "pt"})
st_write.write(d + "/v2.safetensors", {"w": ("F32", [4], b), "sub/x": ("F32", [2, 2], a)}, {"format": "pt"})
st_write.write(d + "/shape.safetensors", {"w": ("F32", [2, 2], a), "sub/x": ("F32", [2, 2], a)}, {"format": "pt"})
PY
if wfs_mount "$B" "$S3" "$M" -o nosync; then
	run "$CTL" import "$work/ck/v1.safetensors" "$M/m"
	expect "import v1: exit 0, writes both" 0 "^import: 2 tensors .* into $M/m\$"
	before=$(getfattr --only-values -n user.weightfs.digest "$M/m/w" 2>/dev/null)
	ino=$(stat -c %i "$M/m/w")
	run "$CTL" import --json "$work/ck/v1.safetensors" "$M/m"
	expect "import v1 again: exit 0" 0
	expect_json "import v1 again: both unchanged" unchanged 2
	expect_json "import v1 again: none replaced" replaced 0
	verdict "import v1 again: the file is left as it was (same inode)" \
		"$([ "$(stat -c %i "$M/m/w")" = "$ino" ]; echo $?)"
	run "$CTL" import "$work/ck/v1.safetensors" "$M/m"
	expect "import v1 again: says unchanged" 0 "^import: 2 tensors .* \(unchanged: all there already\)\$"
	run "$CTL" import "$work/ck/v2.safetensors" "$M/m"
	expect "import v2 (w differs): exit 1, needs --force" 1 "" \
		"^weightfsctl import: $M/m/w: exists with other content, dtype or shape \(--force replaces it\)\$"
	run "$CTL" import "$work/ck/shape.safetensors" "$M/m"
	expect "import with another shape, same bytes: exit 1, needs --force" 1 "" \
		"^weightfsctl import: $M/m/w: exists with other content"
	run "$CTL" import --force --json "$work/ck/v2.safetensors" "$M/m"
	expect_json "import --force v2: replaces w" replaced 1
	expect_json "import --force v2: sub/x unchanged" unchanged 1
	after=$(getfattr --only-values -n user.weightfs.digest "$M/m/w" 2>/dev/null)
	verdict "import --force v2: w holds the new content" "$([ -n "$after" ] && [ "$after" != "$before" ]; echo $?)"
	wfs_umount "$M" || fail "unmount"
else
	fail "mount $S3"
fi
# Outside weightfs (no digest attribute) the bytes are compared.
if setfattr -n user.probe -v 1 "$work/ck" 2>/dev/null; then
	run "$CTL" import "$work/ck/v1.safetensors" "$work/plain"
	run "$CTL" import --json "$work/ck/v1.safetensors" "$work/plain"
	expect_json "import v1 again into a plain directory: both unchanged" unchanged 2
	run "$CTL" import "$work/ck/v2.safetensors" "$work/plain"
	expect "import v2 into a plain directory: exit 1, needs --force" 1 "" "exists with other content"
else
	skip "import into a plain directory: $work keeps no user xattrs"
fi

# ---- 4. fsck names what is broken ------------------------------------------------------------------
S4=$work/store4
if wfs_mount "$B" "$S4" "$M" -o nosync; then
	mkdir -p "$M/rank0" "$M/rank1"
	fill a 4096 >"$M/rank0/w" && fill a 4096 >"$M/rank1/w" && ln "$M/rank0/w" "$M/rank0/w.link"
	fill b 4096 >"$M/rank0/other"
	fill t 10 >"$M/rank0/.wfs-tmp-77-0" # what an interrupted tensor write leaves
	hex=$(getfattr --only-values -n user.weightfs.digest "$M/rank0/w" 2>/dev/null)
	wfs_umount "$M" || fail "unmount"
	rm -f "$S4/objects/${hex:0:2}/${hex:2}"
	run "$CTL" fsck "$S4"
	expect "fsck, a lost object: exit 1, counts its names" 1 \
		"^missing +$hex: object file missing; 3 names fail with EIO until the content is written again\$"
	names=$(grep -A3 "^missing" <<<"$out" | tail -n 3 | sed 's/^ *//' | tr '\n' ' ')
	verdict "fsck, a lost object: the paths of its names follow it" \
		"$([ "$names" = "/rank0/w /rank0/w.link /rank1/w " ]; echo $?)" "names: '$names'" "stdout: $out"
	expect "fsck: the temporary name an interrupted write left" 1 \
		"^tmpname +/rank0/\.wfs-tmp-77-0: temporary name of an interrupted write, never renamed into place: holds 10 bytes\$"
	expect "fsck: the store was closed cleanly" 1 "^clean +lock: closed by its last owner\$"
	run "$CTL" fsck --json "$S4"
	got=$(python3 -c '
import json, sys
r = json.loads(sys.argv[1])
m = [f for f in r["findings"] if f["kind"] == "missing"]
print(r["state"], ",".join(m[0]["names"]) if m else "-")' "$out" 2>/dev/null)
	verdict "fsck --json: state clean, the lost object's names" \
		"$([ "$got" = "clean /rank0/w,/rank0/w.link,/rank1/w" ]; echo $?)" "got '$got'" "stdout: $out"
	run "$CTL" fsck --repair "$S4"
	expect "fsck --repair: removes the temporary name" 1 "^tmpname +/rank0/\.wfs-tmp-77-0: .*\[repaired\]\$"
else
	fail "mount $S4"
fi

# A killed daemon: the offline check says the store was not closed; --repair runs the recovery.
if wfs_mount "$B" "$S4" "$M" -o nosync; then
	pid=$(wfs_pid "$M")
	fill c 100 >"$M/c"
	# Sealed (the digest waits for the seal at the release, which comes after the shell's close) and
	# committed (an fsync of the mount point commits the batch): the kill leaves no orphan object,
	# only the unclean lock this case is about.
	getfattr -n user.weightfs.digest "$M/c" >/dev/null 2>&1
	python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)' "$M"
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null
	fusermount3 -u "$M" 2>/dev/null || fusermount3 -uz "$M"
	unset "WFS_MOUNT_PIDS[$M]"
	run "$CTL" fsck "$S4"
	expect "fsck after kill -9: unclean, names the killed daemon" 1 \
		"^unclean +lock: not closed by its last owner \(pid $pid, mounted on $M\): killed, crashed or a power loss; the next mount \(or fsck --repair\) runs the recovery\$"
	expect "fsck after kill -9: the summary says what is left and what recovers it" 1 \
		"^fsck: left: the store was not closed by its last owner \(a crash\): the next mount, or fsck --repair, runs its recovery\$"
	! grep -q "other problems" <<<"$out"
	verdict "fsck after kill -9: no 'other problems' for the unclean store alone" $? "$out"
	run "$CTL" fsck --json "$S4"
	expect_json "fsck --json after kill -9: state unclean" state unclean
	run "$CTL" fsck --repair "$S4"
	expect "fsck --repair after kill -9: recovered" 1 "^unclean +lock: .*recovered now.*\[repaired\]\$"
	run "$CTL" fsck "$S4"
	expect "fsck after the repair: clean again" 1 "^clean +lock: closed by its last owner\$"
else
	fail "mount $S4 again"
fi

# ---- 5. recovery leaves no declared-but-empty temporary names ---------------------------------------
# A 4 MiB tensor's temporary name is closed empty once its dtype and shape are set, then reopened for
# writing (lib/tensorfile.h); the daemon is killed during the write.
S6=$work/store6
if wfs_mount "$B" "$S6" "$M" -o nosync; then
	pid=$(wfs_pid "$M")
	mkdir -p "$M/rank0"
	fill k 100 >"$M/rank0/kept"
	python3 - "$M/rank0/.wfs-tmp-9-0" "$pid" <<'PY'
import os, signal, sys, time
path, pid = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
os.setxattr(fd, "user.weightfs.shape", b"[1024,1024]")
os.setxattr(fd, "user.weightfs.dtype", b"F32")
os.close(fd)
time.sleep(0.3)  # the daemon commits its batch of changes within 10 ms: the name is in the catalog
fd = os.open(path, os.O_WRONLY)
os.write(fd, b"x" * 1048576)
os.kill(pid, signal.SIGKILL)
PY
	wait "$pid" 2>/dev/null
	fusermount3 -u "$M" 2>/dev/null || fusermount3 -uz "$M"
	unset "WFS_MOUNT_PIDS[$M]"
	: >"$S6/weightfs.log"
	if wfs_mount "$B" "$S6" "$M" -o nosync; then
		names=$(find "$M/rank0" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | tr '\n' ' ')
		verdict "after kill -9 mid-write: the declared-but-empty temporary name is gone" \
			"$([ "$names" = "kept " ]; echo $?)" "rank0: '$names'"
		grep -q "recovered: removed 0 never-sealed names, 1 temporary names sealed empty that declare bytes" \
			"$S6/weightfs.log"
		verdict "after kill -9 mid-write: the recovery says so" $? "$(cat "$S6/weightfs.log")"
		wfs_umount "$M" || fail "unmount"
	else
		fail "mount $S6 after kill -9"
	fi
	run "$CTL" fsck "$S6"
	expect "fsck after that recovery: nothing left" 0 "0 problems"
else
	fail "mount $S6"
fi

# A damaged catalog is reported as such, with what to do (not "No such file or directory").
dd if=/dev/urandom of="$S4/catalog.db" bs=16 count=1 seek=256 conv=notrunc status=none # page 2
run "$CTL" fsck "$S4"
expect "fsck, a damaged catalog: exit 1, says damaged and what to do" 1 \
	"^catalog +catalog\.db: damaged \(SQLite: .*\): the names cannot be read or trusted .*; weightfsctl fsck --repair rebuilds them from catalog\.db\.backup \(of [0-9-]+ [0-9:]+;"
run "$CTL" fsck --json "$S4"
expect_json "fsck --json, a damaged catalog: catalog_damaged" catalog_damaged True
# stat, gc and retain said "cannot read catalog: No such file or directory" there.
for cmd in stat gc retain; do
	run "$CTL" "$cmd" "$S4"
	expect "$cmd, a damaged catalog: says damaged and points to fsck --repair" 1 "" \
		"^weightfsctl $cmd: $S4: the catalog is damaged \(SQLite: .*\): weightfsctl fsck --repair $S4 rebuilds it from catalog\.db\.backup"
done

# ---- 6. a damaged catalog is rebuilt from its backup --------------------------------------------------
# The store keeps what no name uses (retain): b's object, removed after the backup, is still there.
S7=$work/store7
"$CTL" init --retain 1M "$S7" >/dev/null
if wfs_mount "$B" "$S7" "$M" -o nosync; then
	mkdir -p "$M/rank0"
	fill a 1000 >"$M/rank0/a" && fill b 2000 >"$M/rank0/b"
	wfs_umount "$M" || fail "unmount"
fi
verdict "a clean unmount leaves catalog.db.backup" "$([ -s "$S7/catalog.db.backup" ]; echo $?)"
left=$(find "$S7" -maxdepth 1 -name 'catalog.db.backup?*' -printf '%f ')
verdict "the backup is one file (no -wal, -shm or .tmp beside it)" "$([ -z "$left" ]; echo $?)" "found: $left"
# Changes after the backup: a name made, a name removed, then the daemon killed (no backup at exit).
if wfs_mount "$B" "$S7" "$M" -o nosync; then
	pid=$(wfs_pid "$M")
	fill x 3000 >"$M/rank0/x" && rm "$M/rank0/b" && sync -f "$M/rank0"
	sleep 0.2
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null
	fusermount3 -u "$M" 2>/dev/null || fusermount3 -uz "$M"
	unset "WFS_MOUNT_PIDS[$M]"
fi
dd if=/dev/urandom of="$S7/catalog.db" bs=16 count=1 seek=256 conv=notrunc status=none
run "$B/weightfs" "$S7" "$M" -o nosync
expect "a mount of a damaged catalog: refused, says damaged and what to run" 1 "" \
	"^weightfs: $S7/catalog\.db: the catalog is damaged \(SQLite: .*\); see what weightfsctl fsck $S7 says"
run "$CTL" fsck --repair "$S7"
expect "fsck --repair, a damaged catalog: rebuilt from its backup" 0 \
	"^catalog +catalog\.db: damaged \(SQLite: .*\): rebuilt from catalog\.db\.backup of [0-9-]+ [0-9:]+: .*\[repaired\]\$"
expect "fsck --repair: the object written after the backup is kept, unreferenced" 0 \
	"^orphan +[0-9a-f]{32}: object file the rebuilt catalog does not list \(written after its backup\): kept as an unreferenced object.*\[repaired\]\$"
verdict "fsck --repair: the damaged files are kept aside" \
	"$(ls "$S7"/catalog.db.damaged-* >/dev/null 2>&1; echo $?)" "$(ls "$S7")"
run "$CTL" fsck "$S7"
expect "fsck after the rebuild: 0 problems" 0 "0 problems, 0 repaired, 0 left"
run "$CTL" stat --json "$S7"
expect_json "after the rebuild: the names of the backup (a, b)" names 2
expect_json "after the rebuild: x's object kept unreferenced" unreferenced_objects 1
if wfs_mount "$B" "$S7" "$M" -o nosync; then
	got=$(find "$M/rank0" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | tr '\n' ' ')
	verdict "after the rebuild: the mount shows the backup's names" "$([ "$got" = "a b " ]; echo $?)" "ls: '$got'"
	head -c 1000 /dev/zero | tr '\0' a | cmp -s - "$M/rank0/a"
	verdict "after the rebuild: a reads its bytes" $?
	wfs_umount "$M" || fail "unmount"
else
	fail "mount $S7 after the rebuild"
fi

# ---- 7. a lost catalog.db, a lost objects/ ------------------------------------------------------------
# catalog.db gone, its backup there: fsck said "not a weightfs store" (exit 1), repair the same.
S8=$work/store8 S9=$work/store9
cp -a "$S7" "$S8" && cp -a "$S7" "$S9"
rm -f "$S8"/catalog.db "$S8"/catalog.db-wal "$S8"/catalog.db-shm
run "$CTL" fsck "$S8"
expect "fsck, catalog.db missing: says so and that --repair restores it from the backup" 1 \
	"^catalog +catalog\.db: missing: .*; weightfsctl fsck --repair restores it from catalog\.db\.backup \(of "
run "$CTL" fsck --repair "$S8"
expect "fsck --repair, catalog.db missing: restored from catalog.db.backup" 0 \
	"^catalog +catalog\.db: missing: restored from catalog\.db\.backup of [0-9-]+ [0-9:]+: .*\[repaired\]\$"
run "$CTL" fsck "$S8"
expect "fsck after the restore: 0 problems" 0 "0 problems, 0 repaired, 0 left"
# objects/ gone: fsck printed only "...: No such file or directory" (exit 1).
rm -rf "$S9/objects"
run "$CTL" fsck "$S9"
expect "fsck, objects/ missing: one finding for objects/" 1 "^missing +objects/: the objects directory is missing"
expect "fsck, objects/ missing: every object the catalog lists, with its names" 1 \
	"^missing +[0-9a-f]{32}: object file missing; 1 names fail with EIO"
expect "fsck, objects/ missing: the names that fail" 1 "^ +/rank0/a\$"
run "$CTL" fsck --repair "$S9"
expect "fsck --repair, objects/ missing: changes nothing, exit 1" 1 "fsck --repair changes nothing"
verdict "fsck --repair, objects/ missing: no objects/ made" "$([ ! -e "$S9/objects" ]; echo $?)"

# A live mount whose catalog.db was removed: stat said "private to the mounting user: totals from
# the daemon, disk use unknown", to root.
S10=$work/store10
cp -a "$S7" "$S10"
if wfs_mount "$B" "$S10" "$M" -o nosync; then
	rm -f "$S10/catalog.db"
	run "$CTL" stat "$M"
	expect "stat MNT, catalog.db removed under the daemon: says so, exit 1" 1 \
		"^store: +$S10 \(catalog\.db missing: totals from the daemon\)\$" \
		"^weightfsctl stat: $S10: catalog\.db is missing"
	expect "stat MNT, catalog.db removed under the daemon: root still measures objects/" 1 \
		"^physical bytes: +[0-9]+ \([0-9.]+ MiB\); on disk [0-9.]+ MiB\$" \
		"^weightfsctl stat: $S10: catalog\.db is missing"
	verdict "stat MNT, catalog.db removed: not called private" "$(! grep -q private <<<"$out$err"; echo $?)" \
		"stdout: $out" "stderr: $err"
	wfs_umount "$M" || fail "unmount"
else
	fail "mount $S10"
fi

# ---- 8. an inspection makes no file ------------------------------------------------------------------
# stat of an unmounted store left catalog.db-wal and -shm behind; with catalog.db missing, a command
# made them beside the missing file.
S11=$work/store11
"$CTL" init "$S11" >/dev/null
if wfs_mount "$B" "$S11" "$M" -o nosync; then
	fill a 1000 >"$M/a"
	wfs_umount "$M" || fail "unmount"
fi
listing() { find "$1" -maxdepth 1 -printf '%f\n' | sort | tr '\n' ' '; }
before=$(listing "$S11")
for cmd in "stat" "stat --json" "stat --prometheus" "fsck" "fsck --json" "retain" "gc --dry-run"; do
	# shellcheck disable=SC2086 # $cmd: a subcommand and its options
	"$CTL" $cmd "$S11" >/dev/null 2>&1
	after=$(listing "$S11")
	verdict "$cmd of an unmounted store makes no file" "$([ "$after" = "$before" ]; echo $?)" \
		"before: $before" "after:  $after"
	before=$after
done
rm -f "$S11/catalog.db" "$S11/catalog.db-wal" "$S11/catalog.db-shm"
before=$(listing "$S11")
for cmd in "stat" "fsck" "retain" "gc"; do
	"$CTL" "$cmd" "$S11" >/dev/null 2>&1
	after=$(listing "$S11")
	verdict "$cmd, catalog.db missing: makes no file" "$([ "$after" = "$before" ]; echo $?)" \
		"before: $before" "after:  $after"
	before=$after
done

echo "store: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
