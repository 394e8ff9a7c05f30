#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The direct path (lib/direct.h, docs/direct.md) against real mounts, as root.

    test_direct.py --build BUILD [-o passthrough=auto|off]

Mounts a fresh store itself (with allow_other, so `nobody` can try), and remounts it for the checks
that need a new daemon: the object's bytes, permission (nobody's own open fails; forged requests with
a descriptor of another file, an O_PATH descriptor, two descriptors, a long message are refused), a
file being written (EBUSY: load() falls back with one warning), a descriptor that outlives unmount, a
damaged object after a remount (EIO, quarantined), and the page-cache footprint of 4 names with one
content read through the direct path (one copy; the mounted files without passthrough: four).
"""

import argparse
import array
import errno
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wfstest  # noqa: E402
import weightfs  # noqa: E402
from weightfs import errors as werrors  # noqa: E402

MAGIC = 0x31444657
MIB = 1 << 20


def mount(build, store, mnt, opts):
    subprocess.run([os.path.join(build, "weightfs"), store, mnt, "-o", ",".join(["allow_other", "nosync"] + opts)],
                   check=True)


def umount(mnt):
    subprocess.run(["fusermount3", "-u", mnt], check=True)
    for _ in range(100):  # the daemon lets go of the store lock as it exits
        if not os.path.ismount(mnt):
            break
        time.sleep(0.05)
    time.sleep(0.3)


def stats(mnt):
    return json.loads(os.getxattr(mnt, "user.weightfs.stats"))


def forge(sock_name, fds, payload=None):
    """Send a request with descriptors fds to the daemon; the reply's errno (0: an object came)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("\0" + sock_name)
    payload = payload if payload is not None else struct.pack("<II", MAGIC, 1)
    s.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    msg, anc, _, _ = s.recvmsg(16, socket.CMSG_SPACE(8))
    s.close()
    got = array.array("i")
    for lvl, typ, data in anc:
        if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            got.frombytes(data[:len(data) - len(data) % 4])
    for fd in got:
        os.close(fd)
    magic, err, _ = struct.unpack("<IiQ", msg)
    assert magic == MAGIC
    return err


# What `nobody` runs: its own open of a 0600 file, then forged requests (no weightfs import needed).
NOBODY = r"""
import array, errno, json, os, socket, struct, sys
mnt, name = sys.argv[1], sys.argv[2]
out = {}
try:
    os.open(os.path.join(mnt, "secret"), os.O_RDONLY)
    out["open"] = 0
except OSError as e:
    out["open"] = e.errno
def ask(fds):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("\0" + name)
    s.sendmsg([struct.pack("<II", 0x31444657, 1)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    msg, anc, _, _ = s.recvmsg(16, socket.CMSG_SPACE(8))
    return struct.unpack("<IiQ", msg)[1], len(anc)
out["passwd"] = ask([os.open("/etc/passwd", os.O_RDONLY)])
out["o_path"] = ask([os.open(os.path.join(mnt, "secret"), os.O_PATH)])
out["pub"] = ask([os.open(os.path.join(mnt, "pub"), os.O_RDONLY)])
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("-o", dest="opts", action="append", default=[])
    a = ap.parse_args()
    opts = [o for arg in a.opts for o in arg.split(",") if o]
    pt_off = "passthrough=off" in opts
    T = wfstest.Tests(f"python-direct[{'off' if pt_off else 'auto'}]")
    warnings.simplefilter("always")
    work = tempfile.mkdtemp(prefix="wfs-direct.")
    os.chmod(work, 0o755)  # nobody must reach the mount point (not the store: that stays 0700)
    store, mnt = os.path.join(work, "store"), os.path.join(work, "mnt")
    os.mkdir(mnt)
    mount(a.build, store, mnt, opts)
    data = os.urandom(8 * MIB + 123)

    def put(name, b, mode=0o644):
        p = os.path.join(mnt, name)
        with open(p, "wb") as f:
            f.write(b)
        os.chmod(p, mode)
        return p

    try:
        pub = put("pub", data)
        put("secret", data[::-1], 0o600)

        @T.check("open_object: a descriptor of the object file, with the file's bytes")
        def _():
            fd = weightfs.open_object(pub)
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
                assert target.startswith(os.path.join(store, "objects") + "/"), target
                assert os.pread(fd, len(data) + 1, 0) == data
                flags = __import__("fcntl").fcntl(fd, __import__("fcntl").F_GETFL)
                assert flags & os.O_ACCMODE == os.O_RDONLY, flags
            finally:
                os.close(fd)
            s = stats(mnt)
            assert s["direct"] is True and s["since_mount"]["opens_direct"] >= 1, s

        @T.check("load(): maps the object (no mapping of the mounted file), bytes equal")
        def _():
            m = weightfs.load(pub, numpy=True)
            assert m.tobytes() == data
            with open("/proc/self/maps") as f:
                maps = f.read()
            assert os.path.join(store, "objects") in maps and pub not in maps
            del m

        @T.check("weightfsctl stat: shows the direct path served")
        def _():
            r = subprocess.run([os.path.join(a.build, "weightfsctl"), "stat", mnt], capture_output=True, text=True)
            assert "direct path:        served" in r.stdout, r.stdout

        @T.check("not weightfs: open_object -> ENOTSUP; load() reads it, no warning")
        def _():
            try:
                weightfs.open_object("/etc/passwd")
            except OSError as e:
                assert e.errno == errno.ENOTSUP, e
            else:
                raise AssertionError("a descriptor for /etc/passwd")
            plain = os.path.join(work, "plain.bin")
            with open(plain, "wb") as f:
                f.write(data[:4096])
            werrors._reset_warnings()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                assert weightfs.load(plain, numpy=True).tobytes() == data[:4096]
            assert not [x for x in w if issubclass(x.category, weightfs.WeightfsWarning)]

        name = os.getxattr(pub, "user.weightfs.direct").decode()[1:]

        @T.check("nobody: own open of a 0600 file fails; forged descriptors refused; a readable one works")
        def _():
            r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                                "-c", NOBODY, mnt, name], capture_output=True, text=True, cwd="/")
            assert r.returncode == 0, r.stderr
            out = json.loads(r.stdout)
            assert out["open"] == errno.EACCES, out
            assert out["passwd"] == [errno.EXDEV, 0], out  # another filesystem: no descriptor back
            assert out["o_path"] == [errno.EACCES, 0], out  # O_PATH proves no read permission
            assert out["pub"][0] == 0 and out["pub"][1] == 1, out

        @T.check("malformed requests: two descriptors, a long message, a wrong magic -> EPROTO")
        def _():
            fd1, fd2 = os.open(pub, os.O_RDONLY), os.open(pub, os.O_RDONLY)
            try:
                assert forge(name, [fd1, fd2]) == errno.EPROTO
                assert forge(name, [fd1], struct.pack("<III", MAGIC, 1, 0)) == errno.EPROTO
                assert forge(name, [fd1], struct.pack("<II", 0x1234, 1)) == errno.EPROTO
                assert forge(name, [fd1]) == 0
            finally:
                os.close(fd1)
                os.close(fd2)

        @T.check("xattr: user.weightfs.direct cannot be set or removed")
        def _():
            for op in (lambda: os.setxattr(pub, "user.weightfs.direct", b"@x"),
                       lambda: os.removexattr(pub, "user.weightfs.direct")):
                try:
                    op()
                except OSError as e:
                    assert e.errno == errno.EPERM, e
                else:
                    raise AssertionError("allowed")

        @T.check("a FIFO in the mount: open_object refuses at once (EINVAL), never waits for a writer")
        def _():
            fifo = os.path.join(mnt, "fifo")
            os.mkfifo(fifo)
            t0 = time.monotonic()
            try:
                weightfs.open_object(fifo)
            except OSError as e:
                assert e.errno == errno.EINVAL, e
            else:
                raise AssertionError("a FIFO gave an object")
            assert time.monotonic() - t0 < 5
            os.unlink(fifo)

        @T.check("being written: EBUSY; load() reads the mounted file with one warning")
        def _():
            p = os.path.join(mnt, "busy")
            wfd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.write(wfd, data[:8192])
                try:
                    weightfs.open_object(p)
                except OSError as e:
                    assert e.errno == errno.EBUSY, e
                else:
                    raise AssertionError("an object for a file being written")
                werrors._reset_warnings()
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    for _ in range(3):
                        assert weightfs.load(p, numpy=True).tobytes() == data[:8192]
                msgs = [str(x.message) for x in w if issubclass(x.category, weightfs.WeightfsWarning)]
                assert len(msgs) == 1 and "being written" in msgs[0], msgs
            finally:
                os.close(wfd)

        put("dmg", data[: 4 * MIB])
        keep = weightfs.open_object(pub)
        umount(mnt)

        @T.check("a descriptor from the direct path outlives unmount")
        def _():
            assert os.pread(keep, len(data) + 1, 0) == data
        os.close(keep)

        # Damage dmg's object behind the daemon's back, then mount: not verified by this daemon yet.
        obj = os.path.join(store, "objects", *(lambda h: (h[:2], h[2:]))(weightfs.digest(data[: 4 * MIB])))
        with open(obj, "r+b") as f:
            f.seek(12345)
            b = f.read(1)
            f.seek(12345)
            f.write(bytes([b[0] ^ 0xFF]))
        mount(a.build, store, mnt, opts)

        @T.check("damaged object after a remount: open_object and load -> EIO, quarantined")
        def _():
            for fn in (weightfs.open_object, lambda p: weightfs.load(p, numpy=True)):
                try:
                    fn(os.path.join(mnt, "dmg"))
                except OSError as e:
                    assert e.errno == errno.EIO, e
                else:
                    raise AssertionError("damaged bytes handed out")
            assert not os.path.exists(obj)
            q = os.listdir(os.path.join(store, "quarantine"))
            assert len(q) == 1, q
            assert weightfs.load(pub, numpy=True).tobytes() == data  # the others still work

        # Page-cache footprint: 4 names, one content, read in full.
        size = 64 * MIB
        body = os.urandom(size)
        names = [put(f"same{i}", body) for i in range(4)]

        def grow(direct):
            os.environ["WEIGHTFS_DIRECT"] = "1" if direct else "0"
            try:
                umount(mnt)
                mount(a.build, store, mnt, opts)
                wfstest.drop_caches()
                before = wfstest.cached_bytes()[0]
                maps = [weightfs.load(p, numpy=True) for p in names]
                assert all(int(m[::4096].sum() >= 0) for m in maps)
                assert all(m.tobytes() == body for m in maps)
                after = wfstest.cached_bytes()[0]
                del maps
                return after - before
            finally:
                os.environ.pop("WEIGHTFS_DIRECT", None)

        @T.check("footprint: 4 names x 64 MiB through the direct path cache one copy")
        def _():
            g = grow(True)
            print(f"  direct: Cached +{g / MIB:.1f} MiB for 4 x 64 MiB", flush=True)
            assert g < 1.6 * size, g
        if pt_off:
            @T.check("footprint: the same through the mounted files without passthrough: about four copies")
            def _():
                g = grow(False)
                print(f"  mounted, passthrough off: Cached +{g / MIB:.1f} MiB for 4 x 64 MiB", flush=True)
                assert g > 2.5 * size, g
    finally:
        if os.path.ismount(mnt):
            umount(mnt)
        subprocess.run(["rm", "-rf", work])
    return T.finish()


if __name__ == "__main__":
    sys.exit(main())
