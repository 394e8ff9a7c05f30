#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Everyday tools on a real mount: rsync -aHAX, cp -a and tar --xattrs copy trees into weightfs and
# back out, exit 0, and keep every user.* attribute except the computed user.weightfs.digest (read
# by name, never listed, so no copy carries it); a tree with every file type, hard links, symlinks,
# modes, owners and times comes back as the same round trip through a plain directory gives it. Root only (FUSE). Prints one ok/FAIL line per check
# and closes with "tools: N passed, N failed".
#   usage: tests/cli/test_tools.sh BUILD_DIR
set -uo pipefail

if [ $# -ne 1 ]; then
	echo "usage: $0 BUILD_DIR" >&2
	exit 2
fi
B=$(cd "$1" && pwd) || exit 2
work=$(mktemp -d "${TMPDIR:-/tmp}/wfs-tools.XXXXXX") || exit 1
MNT=$work/mnt
cleanup() {
	wfs_umount "$MNT" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. "$(dirname "$0")/../lib/check.sh" # ok, fail, skip, verdict, run, expect
. "$(dirname "$0")/../lib/mount.sh" # wfs_mount, wfs_umount

for tool in rsync tar getfattr setfattr xxhsum; do
	command -v "$tool" >/dev/null || {
		echo "tools: $tool is missing (run .ci/setup-debian)" >&2
		exit 1
	}
done

# A source tree as a trainer's checkpoint directory looks: tensors with their attributes, a hard
# link, a symlink, modes, an empty file and a subdirectory.
src=$work/src
mkdir -p "$src/rank0/sub"
head -c 300000 /dev/urandom >"$src/rank0/a.bin"
head -c 5000 /dev/urandom >"$src/rank0/sub/b.bin"
: >"$src/rank0/empty"
cp "$src/rank0/a.bin" "$src/rank0/same-as-a.bin"
ln "$src/rank0/sub/b.bin" "$src/rank0/b-link.bin"
ln -s sub/b.bin "$src/rank0/b-symlink"
chmod 600 "$src/rank0/a.bin"
chmod 751 "$src/rank0/sub"
setfattr -n user.weightfs.dtype -v U8 "$src/rank0/a.bin"
setfattr -n user.weightfs.shape -v '[300000]' "$src/rank0/a.bin"
setfattr -n user.note -v 'frozen base' "$src/rank0/sub/b.bin"
touch -d '2024-01-02 03:04:05' "$src/rank0/a.bin"

# attrs DIR: every file's user.* attributes, in name order: "PATH: name=value" lines.
attrs() {
	local f
	(cd "$1" && find . ! -type l | sort | while read -r f; do
		getfattr -h -d -m '^user\.' --absolute-names "$f" 2>/dev/null | sed -n "s|^user|$f: user|p"
	done)
}
# same_tree A B: contents, modes, link counts of regular files, symlink targets and user.* attributes.
same_tree() {
	local a=$1 b=$2
	diff -r --no-dereference "$a" "$b" >/dev/null || return 1
	[ "$(cd "$a" && find . -printf '%p %y %m %n %l\n' | sort)" = \
		"$(cd "$b" && find . -printf '%p %y %m %n %l\n' | sort)" ] || return 1
	[ "$(attrs "$a")" = "$(attrs "$b")" ]
}

wfs_mount "$B" "$work/store" "$MNT" || {
	echo "tools: mount failed" >&2
	exit 1
}

run rsync -aHAX "$src/" "$MNT/in/"
expect "rsync -aHAX into the mount: exit 0" 0
if same_tree "$src" "$MNT/in"; then
	ok "rsync -aHAX into the mount: same tree, modes, hard links, symlinks, user.* attributes"
else
	fail "rsync -aHAX into the mount: same tree" "$(diff <(attrs "$src") <(attrs "$MNT/in"))"
fi
if getfattr -n user.weightfs.digest "$MNT/in/rank0/a.bin" >/dev/null 2>&1 &&
	! getfattr -d -m - "$MNT/in/rank0/a.bin" 2>/dev/null | grep -q 'user.weightfs.digest'; then
	ok "the digest is readable by name and not listed"
else
	fail "the digest is readable by name and not listed" "$(getfattr -d -m - "$MNT/in/rank0/a.bin" 2>&1)"
fi
run rsync -aHAX --itemize-changes "$src/" "$MNT/in/"
expect "rsync -aHAX again: exit 0" 0
if [ -z "$out" ]; then
	ok "rsync -aHAX again: nothing to change"
else
	fail "rsync -aHAX again: nothing to change" "$out"
fi

run rsync -aHAX "$MNT/in/" "$work/out/"
expect "rsync -aHAX out of the mount: exit 0" 0
if same_tree "$src" "$work/out" && ! attrs "$work/out" | grep -q weightfs.digest; then
	ok "rsync -aHAX out of the mount: the source tree, no digest attribute"
else
	fail "rsync -aHAX out of the mount: the source tree, no digest attribute" \
		"$(diff <(attrs "$src") <(attrs "$work/out"))"
fi

run cp -a "$MNT/in" "$work/cp"
expect "cp -a out of the mount: exit 0" 0 "" "^$"
if same_tree "$src" "$work/cp"; then
	ok "cp -a out of the mount: the source tree, no digest attribute"
else
	fail "cp -a out of the mount: the source tree" "$(diff <(attrs "$src") <(attrs "$work/cp"))"
fi
run cp -a "$work/cp" "$MNT/cp"
expect "cp -a into the mount: exit 0, no warnings" 0 "" "^$"

run tar --xattrs --xattrs-include='user.*' -C "$MNT/in" -cf "$work/t.tar" .
expect "tar --xattrs -c of the mount: exit 0, no warnings" 0 "" "^$"
mkdir "$MNT/tar"
run tar --xattrs --xattrs-include='user.*' -C "$MNT/tar" -xf "$work/t.tar"
expect "tar --xattrs -x into the mount: exit 0, no warnings" 0 "" "^$"
if same_tree "$src" "$MNT/tar"; then
	ok "tar round trip through the mount: the source tree"
else
	fail "tar round trip through the mount: the source tree" "$(diff <(attrs "$src") <(attrs "$MNT/tar"))"
fi

# A copy made by an older weightfs, which listed the digest: it carries user.weightfs.digest as a
# plain attribute. Going back in, its own value is accepted (nothing is stored); a wrong one is not.
mkdir -p "$work/stale"
cp "$src/rank0/a.bin" "$work/stale/a.bin"
digest=$(xxhsum -H2 "$work/stale/a.bin" 2>/dev/null | cut -d' ' -f1)
setfattr -n user.weightfs.digest -v "$digest" "$work/stale/a.bin"
run rsync -aX "$work/stale/" "$MNT/stale/"
expect "rsync -aX of a copy carrying its digest attribute: exit 0" 0
got=$(getfattr --only-values -n user.weightfs.digest "$MNT/stale/a.bin" 2>/dev/null)
if [ "$got" = "$digest" ]; then
	ok "the digest attribute that came with it is the file's own"
else
	fail "the digest attribute that came with it is the file's own" "got '$got', want '$digest'"
fi
setfattr -n user.weightfs.digest -v 00000000000000000000000000000000 "$work/stale/a.bin"
run setfattr -n user.weightfs.digest -v 00000000000000000000000000000000 "$MNT/stale/a.bin"
expect "a digest attribute that is not the file's: refused" 1 "" "Operation not permitted"

# Every file type, owners and times: each tool's round trip into the mount and back out must give
# what the same round trip through a plain directory gives (the filesystem under /tmp here).
full=$work/full
mkdir -p "$full/d/sub"
head -c 70000 /dev/urandom >"$full/d/data"
ln "$full/d/data" "$full/d/data-link"
ln -s data "$full/d/symlink"
mkfifo "$full/d/fifo"
mknod "$full/d/chardev" c 1 3
mknod "$full/d/blockdev" b 7 200
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$full/d/socket"
chown nobody:nogroup "$full/d/data" "$full/d/fifo"
chmod 4750 "$full/d/sub"
chmod 640 "$full/d/data"
setfattr -n user.kind -v weights "$full/d/data"
touch -h -d '2023-05-06 07:08:09.123456789' "$full/d/symlink"
touch -d '2022-01-02 03:04:05.5' "$full/d/data" "$full/d/fifo" "$full/d/chardev"
touch -d '2021-01-01 00:00:00' "$full/d/sub" "$full/d"
# listing DIR [TOOL]: type, mode, owner, links, mtime (ns), target or device numbers, user.*
# attributes. rsync does not keep the times of device nodes and sockets (on any filesystem): their
# times are left out of its listing.
listing() {
	(cd "$1" && find . -mindepth 1 -printf '%p %y %m %u:%g %n %T@ %l\n' |
		if [ "${2:-}" = rsync ]; then awk '$2 ~ /^[bcs]$/ { $6 = "-" } 1'; else cat; fi | sort &&
		find . -mindepth 1 \( -type b -o -type c \) -exec stat -c '%n %t:%T' {} + | sort && attrs .)
}
# roundtrip TOOL IN OUT: copy $full/d into IN/ and then IN/ into OUT/ with TOOL (rsync, cp, tar).
roundtrip() {
	local tool=$1 in=$2 out=$3
	mkdir -p "$in" "$out"
	case $tool in
	rsync) rsync -aHAX "$full/d/" "$in/" && rsync -aHAX "$in/" "$out/" ;;
	cp) cp -a "$full/d/." "$in/" && cp -a "$in/." "$out/" ;;
	tar) tar --xattrs --xattrs-include='user.*' -C "$full/d" -cf "$work/$tool-1.tar" . &&
		tar --xattrs --xattrs-include='user.*' -C "$in" -xf "$work/$tool-1.tar" &&
		tar --xattrs --xattrs-include='user.*' -C "$in" -cf "$work/$tool-2.tar" . &&
		tar --xattrs --xattrs-include='user.*' -C "$out" -xf "$work/$tool-2.tar" ;;
	esac
}
for tool in rsync cp tar; do
	if roundtrip $tool "$work/plain-$tool-in" "$work/plain-$tool-out" 2>"$work/plain-$tool.err" &&
		roundtrip $tool "$MNT/full-$tool" "$work/wfs-$tool-out" 2>"$work/wfs-$tool.err"; then
		if [ "$(listing "$work/wfs-$tool-out" $tool)" = "$(listing "$work/plain-$tool-out" $tool)" ] &&
			[ "$(listing "$MNT/full-$tool" $tool)" = "$(listing "$work/plain-$tool-in" $tool)" ]; then
			ok "$tool round trip with every file type, owners, times: as through a plain directory"
		else
			fail "$tool round trip with every file type, owners, times: as through a plain directory" \
				"$(diff <(listing "$work/plain-$tool-out" $tool) <(listing "$work/wfs-$tool-out" $tool))" \
				"$(diff <(listing "$work/plain-$tool-in" $tool) <(listing "$MNT/full-$tool" $tool))"
		fi
	else
		fail "$tool round trip with every file type: exit 0" "$(cat "$work/plain-$tool.err" "$work/wfs-$tool.err")"
	fi
done

wfs_umount "$MNT"
verdict "the daemon exits 0 at unmount" $?

echo "tools: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
