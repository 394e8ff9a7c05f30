#!/usr/bin/env bash
# weightfsctl exit codes and messages (stat, fsck, gc, usage errors) on a store made through a real
# mount. Root only (FUSE). Prints one ok/FAIL line per check and closes with "cli: N passed, N failed".
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
	for m in "$MNT" "$work/hmnt"; do
		if mountpoint -q "$m" 2>/dev/null; then
			fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null
		fi
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

passed=0 failed=0
ok() {
	echo "ok   $1"
	passed=$((passed + 1))
}
fail() {
	echo "FAIL $1"
	shift
	local line
	for line in "$@"; do
		printf '       %s\n' "$line"
	done
	failed=$((failed + 1))
}

# run CMD...: its stdout in $out, stderr in $err, exit status in $rc.
out='' err='' rc=0
run() {
	out=$("$@" 2>"$work/stderr")
	rc=$?
	err=$(<"$work/stderr")
}

# expect NAME RC [STDOUT_REGEX [STDERR_REGEX]]: the last run exited RC and its output matches.
expect() {
	local name=$1 want=$2 out_re=${3:-} err_re=${4:-}
	if [ "$rc" -ne "$want" ]; then
		fail "$name" "exit $rc, want $want" "stdout: $out" "stderr: $err"
	elif [ -n "$out_re" ] && ! grep -Eq -- "$out_re" <<<"$out"; then
		fail "$name" "stdout does not match /$out_re/" "stdout: $out"
	elif [ -n "$err_re" ] && ! grep -Eq -- "$err_re" <<<"$err"; then
		fail "$name" "stderr does not match /$err_re/" "stderr: $err"
	else
		ok "$name"
	fi
}

# json_num KEY: the number after "KEY": in $out (empty when absent).
json_num() {
	sed -nE "s/.*\"$1\": ([0-9.]+).*/\1/p" <<<"$out"
}

# expect_json NAME KEY VALUE: the last run's JSON has "KEY": VALUE.
expect_json() {
	local got
	got=$(json_num "$2")
	if [ "$got" = "$3" ]; then
		ok "$1"
	else
		fail "$1" "\"$2\": '$got', want $3" "stdout: $out"
	fi
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

# ---- fsck and gc while mounted --------------------------------------------------------------------
run "$CTL" fsck "$MNT"
expect "fsck MNT (mounted): read-only check, exit 0" 0 \
	"^fsck: $STORE \(mounted: read-only check\): [0-9]+ objects .* checked; 0 problems, 0 repaired, 0 left\$"
run "$CTL" fsck --repair "$MNT"
expect "fsck --repair MNT (mounted): exit 1, says unmount" 1 "" "^weightfsctl fsck: $STORE: mounted: unmount it"
run "$CTL" gc "$MNT"
expect "gc MNT (mounted): exit 1, says unmount" 1 "" "^weightfsctl gc: .*mounted: unmount it first"

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
expect "fsck --repair STORE: quarantines, exit 0" 0 "^corrupt +$hex: .*\[repaired\]\$"
if [ -f "$STORE/quarantine/$hex" ] && [ ! -e "$obj" ]; then
	ok "fsck --repair: object moved to quarantine/$hex"
else
	fail "fsck --repair: object moved to quarantine/$hex" "$(ls -R "$STORE/quarantine" "$STORE/objects" 2>&1)"
fi

run "$CTL" fsck "$STORE"
expect "fsck STORE after repair: exit 1 (missing, quarantined)" 1 "^missing +$hex: .*quarantined"
others=$(grep -Ev "^(missing +$hex|quarantined +quarantine/$hex|fsck): " <<<"$out")
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
expect "weightfsctl fsck (not a store): exit 1" 1 "" "not a weightfs store or mount"
run "$CTL" --help
expect "weightfsctl --help: exit 0" 0 "^usage: weightfsctl COMMAND"
for sub in stat fsck gc stage; do
	run "$CTL" "$sub" --help
	expect "weightfsctl $sub --help: exit 0" 0 "^usage: weightfsctl $sub"
done

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

echo "cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
