# SPDX-License-Identifier: Apache-2.0
"""Helpers the Python tests share (conftest.py, the test_*.py modules, tests/bench): mounting a
store, the store's objects, xxhsum, and the page cache (drop it, measure it).

The tests themselves are pytest modules; conftest.py holds their fixtures and the closing count.
"""

import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "lib", "python"))


def mount(build, store, mnt, opts=()):
    """Mount STORE on MNT with BUILD's weightfs, -o nosync plus OPTS (a list of options)."""
    os.makedirs(store, exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    subprocess.run([os.path.join(build, "weightfs"), store, mnt, "-o", ",".join(["nosync"] + list(opts))],
                   check=True)


def umount(mnt):
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    for _ in range(100):  # the daemon lets go of the store lock as it exits
        if not os.path.ismount(mnt):
            break
        time.sleep(0.05)
    time.sleep(0.3)


def _objects_now(store):
    out = {}
    top = os.path.join(store, "objects")
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue  # removed meanwhile: the next listing settles it
            out[os.path.relpath(p, top)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def objects(store, settle_s=0.3, timeout_s=10.0):
    """{relative path: (size, mtime_ns, inode)} of the object files under STORE/objects, once two
    listings settle_s apart agree (up to timeout_s): a file closed just before is sealed at its
    release, after close(2) returned, and its object may still be on its way (a loaded machine
    took seconds)."""
    deadline = time.monotonic() + timeout_s
    last = _objects_now(store)
    while True:
        time.sleep(settle_s)
        now = _objects_now(store)
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def xxhsum(path):
    r = subprocess.run(["xxhsum", "-H2", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, check=True)
    return r.stdout.split()[0]


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def cached_bytes():
    """(Cached from /proc/meminfo, page cache of this process's memory cgroup or None), in bytes."""
    with open("/proc/meminfo") as f:
        cached = next(int(line.split()[1]) * 1024 for line in f if line.startswith("Cached:"))
    return cached, cgroup_file_bytes()


def cgroup_file_bytes():
    """Page-cache bytes charged to this process's memory cgroup (v2 'file', v1 'cache'), or None."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, ctrl, path = line.split(":", 2)
        if ctrl == "memory":
            stat, key = f"/sys/fs/cgroup/memory{path}/memory.stat", "cache"
            break
    else:
        path = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
        if path is None:
            return None
        stat, key = f"/sys/fs/cgroup{path}/memory.stat", "file"
        if not os.path.exists(stat):
            stat = f"/sys/fs/cgroup/unified{path}/memory.stat"
    try:
        with open(stat) as f:
            for line in f:
                k, v = line.split()
                if k == key:
                    return int(v)
    except OSError:
        return None
    return None
