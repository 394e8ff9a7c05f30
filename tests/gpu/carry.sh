#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Put into BUILD/carry what tests/gpu/device-run.sh needs on the GPU test machine, which has no
# package registry: the shared libraries the build links against (except glibc's and CUDA's, which
# are there) in BUILD/carry/lib; xxhsum, fusermount3, getfattr and setfattr in BUILD/carry/bin; and
# pytest with the pure-Python modules it imports in BUILD/carry/python (for tests/python/test_gpu.py
# where the machine's python3 has no pytest; they are this machine's Python 3.11 modules).
#   usage: tests/gpu/carry.sh [BUILD_DIR]      (then carry BUILD_DIR to the device machine)
set -euo pipefail
B=${1:-build}
mkdir -p "$B/carry/lib" "$B/carry/bin"
for bin in "$B/weightfs" "$B/weightfsctl" "$B/libweightfs.so" "$B"/tests/check_*; do
	[ -e "$bin" ] || continue
	ldd "$bin" 2>/dev/null | awk '$3 ~ /^\// { print $3 }' || true # static binaries: none
done | sort -u | while read -r lib; do
	case $(basename "$lib") in
	libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libcuda*) ;;
	*) cp -L "$lib" "$B/carry/lib/" ;;
	esac
done
# getfattr/setfattr: the takeover scripts ask a file's digest with them (attr, libc only).
cp -L "$(command -v xxhsum)" "$(command -v fusermount3)" "$(command -v getfattr)" "$(command -v setfattr)" \
	"$B/carry/bin/"
py=
for cand in ${WFS_PYTHON:-} python3 /usr/bin/python3; do
	if command -v "$cand" >/dev/null && "$cand" -c 'import pytest' 2>/dev/null; then
		py=$cand
		break
	fi
done
[ -n "$py" ] || { echo "carry.sh: no python3 with pytest (python3-pytest)" >&2; exit 1; }
rm -rf "$B/carry/python"
mkdir -p "$B/carry/python"
site=$("$py" -c 'import os, pytest; print(os.path.dirname(os.path.dirname(pytest.__file__)))')
for mod in pytest _pytest pluggy iniconfig packaging attr attrs py py.py exceptiongroup tomli; do
	[ -e "$site/$mod" ] && cp -rL "$site/$mod" "$B/carry/python/"
done
find "$B/carry/python" -name __pycache__ -prune -exec rm -rf {} +
echo "carry.sh: $(find "$B/carry/lib" -type f | wc -l) libraries, xxhsum, fusermount3, getfattr and setfattr, pytest in $B/carry"
