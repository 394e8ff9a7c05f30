#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Install BUILD_DIR's weightfs .deb (make deb) with dpkg -i in a throwaway root and run it from there:
# an overlay of / whose upper layer is a tmpfs, in a private mount namespace, chrooted into. The
# package's dependencies are this machine's (the build's), so dpkg -i needs no package registry, and
# neither this machine's / nor its dpkg database changes (checked after). Where lintian is installed,
# the package passes it. Root only. Prints one ok/FAIL/skip line per check and closes with
# "deb: N passed, N failed, N skipped".
#   usage: tests/deb/test_deb.sh BUILD_DIR
set -uo pipefail

if [ $# -lt 1 ]; then
	echo "usage: $0 BUILD_DIR" >&2
	exit 2
fi
repo=$(cd "$(dirname "$0")/../.." && pwd)
version=$(cat "$repo/VERSION")

# ---- inside the namespace: tests/deb/test_deb.sh --inside DEB WORK ----------------------------------
if [ "$1" = --inside ]; then
	deb=$2 work=$3
	. "$repo/tests/lib/check.sh" # ok, fail, verdict, run, expect
	root=$work/root
	if ! { mount -t tmpfs tmpfs "$work" && mkdir "$work/upper" "$work/ovl" "$root" &&
		mount -t overlay overlay -o "lowerdir=/,upperdir=$work/upper,workdir=$work/ovl" "$root" &&
		mount --rbind /dev "$root/dev" && mount -t proc proc "$root/proc"; }; then
		echo "FAIL make the throwaway root (overlay of / in $work)"
		echo "in-root: 0 passed, 1 failed"
		exit 1
	fi
	cp "$deb" "$root/tmp/weightfs.deb"
	# A clean environment: nothing of the build tree (PYTHONPATH, WEIGHTFS_LIB) leaks in.
	in_root() { run chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }

	in_root dpkg -i /tmp/weightfs.deb
	expect "dpkg -i $(basename "$deb"): exit 0" 0
	# shellcheck disable=SC2016 # dpkg-query's own ${field} syntax
	in_root dpkg-query -W -f='${Status} ${Version}' weightfs
	expect "dpkg: weightfs $version installed" 0 "^install ok installed $version\$"
	in_root weightfs --version
	expect "weightfs --version: $version" 0 "^weightfs $version \(libfuse "
	in_root weightfsctl --version
	expect "weightfsctl --version: $version" 0 "^weightfsctl $version\$"
	in_root weightfsctl --help
	expect "weightfsctl --help: exit 0" 0 "^usage: weightfsctl COMMAND"
	in_root sh -c 'ldd /usr/bin/weightfs /usr/bin/weightfsctl /usr/lib/libweightfs.so'
	! grep -qE 'not found|libcuda' <<<"$out"
	verdict "installed binaries: every library found, no CUDA library linked" $? "$out"
	in_root python3 -c 'import weightfs, weightfs.stage as s
print(weightfs.__version__); print(weightfs.__file__); print(s.library()._name); print(weightfs.digest(b"abc"))'
	want="$version
/usr/lib/python3/dist-packages/weightfs/__init__.py
/usr/lib/libweightfs.so
06b05ab6733a618578af5f94892f3950"
	[ "$rc" -eq 0 ] && [ "$out" = "$want" ]
	verdict "python3: import weightfs from the package, /usr/lib/libweightfs.so, digest" $? \
		"exit $rc" "stdout: $out" "stderr: $err"
	in_root grep -x "bindir=/usr/bin" /usr/sbin/mount.fuse.weightfs
	expect "mount.fuse.weightfs runs /usr/bin/weightfs" 0
	# shellcheck disable=SC2016 # $p is the inner shell's
	in_root sh -c 'for p in weightfs weightfsctl mount.fuse.weightfs umount.fuse.weightfs; do
		zcat /usr/share/man/man8/$p.8.gz | head -n 1; done'
	[ "$(grep -c "\"weightfs $version\"" <<<"$out")" -eq 4 ]
	verdict "man pages, gzipped: weightfs.8, weightfsctl.8 ($version), the mount helpers' links" $? "$out"
	# Debian policy: the copyright file, machine-readable (DEP-5), and a changelog.
	in_root sh -c 'head -n 1 /usr/share/doc/weightfs/copyright &&
		grep -x "License: Apache-2.0" /usr/share/doc/weightfs/copyright | head -n 1 &&
		zcat /usr/share/doc/weightfs/changelog.gz | head -n 1'
	want="Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
License: Apache-2.0
weightfs ($version) unstable; urgency=medium"
	[ "$rc" -eq 0 ] && [ "$out" = "$want" ]
	verdict "/usr/share/doc/weightfs: copyright (DEP-5, Apache-2.0) and changelog.gz" $? "exit $rc" "$out"
	in_root dpkg -r weightfs
	expect "dpkg -r weightfs: exit 0" 0
	[ ! -e "$root/usr/bin/weightfs" ] && [ ! -e "$root/usr/lib/libweightfs.so" ] &&
		[ ! -e "$root/usr/lib/python3/dist-packages/weightfs" ]
	verdict "dpkg -r: the daemon, the library and the Python package are gone" $? \
		"left: $(ls -A "$root/usr/lib/python3/dist-packages/weightfs" 2>&1)"
	echo "in-root: $passed passed, $failed failed"
	[ "$failed" -eq 0 ]
	exit
fi

# ---- outside: make the namespace, check the machine after --------------------------------------------
B=$(cd "$1" && pwd) || exit 2
deb=$B/weightfs_${version}_$(dpkg --print-architecture).deb
if [ ! -f "$deb" ]; then
	echo "deb: $deb is missing (run make deb)"
	echo "deb: 0 passed, 1 failed"
	exit 1
fi
before=$(dpkg-query -W -f='${Status} ${Version}' weightfs 2>/dev/null || true)
work=$(mktemp -d "${TMPDIR:-/tmp}/wfs-deb.XXXXXX") || exit 1
trap 'rmdir "$work" 2>/dev/null || rm -rf "$work"' EXIT
. "$repo/tests/lib/check.sh" # ok, fail, verdict
inside=$(unshare --mount --propagation private "$0" --inside "$deb" "$work" 2>&1)
rc=$?
echo "$inside"
if [[ $inside =~ in-root:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
	passed=${BASH_REMATCH[1]} failed=${BASH_REMATCH[2]}
else
	fail "the checks in the throwaway root ran (exit $rc)"
fi
[ "$rc" -eq 0 ] || [ "$failed" -gt 0 ] || fail "the checks in the throwaway root exited $rc"
# The namespace is gone with its mounts: the machine's package database is as it was.
after=$(dpkg-query -W -f='${Status} ${Version}' weightfs 2>/dev/null || true)
[ "$before" = "$after" ] && [ -z "$(ls -A "$work")" ]
verdict "this machine's dpkg database is as before ('${before:-no weightfs}'), nothing left in $work" $? \
	"weightfs: '$before' -> '$after'" "$work: $(ls -A "$work")"
# Debian's package checker, where installed (CI does not install it). Suppressed, with the reason:
# sharedobject-in-library-directory-missing-soname: libweightfs.so has no SONAME, as nothing links
# it (the Python package loads it by path); a versioned library is a decision still to make.
if command -v lintian >/dev/null; then
	lint=$(lintian --fail-on error,warning --suppress-tags sharedobject-in-library-directory-missing-soname \
		"$deb" 2>&1)
	verdict "lintian: no error or warning" $? "$lint"
else
	skip "lintian: not installed"
fi
echo "deb: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
