# SPDX-License-Identifier: Apache-2.0
"""The direct path (lib/direct.h, docs/direct.md) against real mounts, as root.

    python3 -m pytest tests/python/test_direct.py [-k NAME] [--build BUILD] [--mount-opts=passthrough=off]

Mounts a fresh store itself, with allow_other (so `nobody` can try) and --mount-opts (test_python.sh
BUILD direct -o OPTS passes them), and mounts it again for the tests that need a new daemon: the
object's bytes, permission (nobody's own open fails; forged requests with a descriptor of another
file, an O_PATH descriptor, two descriptors, a long message are refused), another user's idle
connections (they delay no request; one without a request is closed after 2 s), a file being written
(EBUSY: load() falls back with one warning), a descriptor that outlives unmount, a damaged object
after a remount (EIO, quarantined), and the page-cache footprint of 4 names with one content read
through the direct path (one copy; the mounted files without passthrough: four, a test skipped
unless --mount-opts has passthrough=off). A test that unmounts mounts the store again before it
ends, so each runs alone.
"""

import array
import errno
import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import warnings

import pytest

import wfstest

import weightfs
from weightfs import errors as werrors

MAGIC = 0x31444657
MIB = 1 << 20


class DirectMount:
    """A store in a private directory, mounted with allow_other and the options of the run."""

    def __init__(self, build, opts):
        self.build, self.opts = build, ["allow_other"] + opts
        self.work = tempfile.mkdtemp(prefix="wfs-direct.")
        os.chmod(self.work, 0o755)  # nobody must reach the mount point (not the store: that stays 0700)
        self.store, self.mnt = os.path.join(self.work, "store"), os.path.join(self.work, "mnt")
        self.data = os.urandom(8 * MIB + 123)

    def mount(self):
        wfstest.mount(self.build, self.store, self.mnt, self.opts)

    def umount(self):
        wfstest.umount(self.mnt)

    def put(self, name, b, mode=0o644):
        p = os.path.join(self.mnt, name)
        with open(p, "wb") as f:
            f.write(b)
        os.chmod(p, mode)
        return p


@pytest.fixture(scope="module")
def m(build, mount_opts):
    """The mount, with MNT/pub (8 MiB + 123 random bytes, 0644) and MNT/secret (0600)."""
    m = DirectMount(build, mount_opts)
    try:
        m.mount()
        m.pub = m.put("pub", m.data)
        m.put("secret", m.data[::-1], 0o600)
        yield m
    finally:
        if os.path.ismount(m.mnt):
            m.umount()
        subprocess.run(["rm", "-rf", m.work])


@pytest.fixture(autouse=True)
def _warnings_always():
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        yield


@pytest.fixture
def sock(m):
    """The daemon's direct-path socket (abstract name) as MNT/pub's xattr gives it."""
    return os.getxattr(m.pub, "user.weightfs.direct").decode()[1:]


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


# ---- the first daemon -------------------------------------------------------------------------

def test_open_object_a_descriptor_of_the_object_file_with_the_file_s_bytes(m):
    """open_object: a descriptor of the object file, with the file's bytes"""
    fd = weightfs.open_object(m.pub)
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
        assert target.startswith(os.path.join(m.store, "objects") + "/"), target
        assert os.pread(fd, len(m.data) + 1, 0) == m.data
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        assert flags & os.O_ACCMODE == os.O_RDONLY, flags
    finally:
        os.close(fd)
    s = stats(m.mnt)
    assert s["direct"] is True and s["since_mount"]["opens_direct"] >= 1, s


def test_load_maps_the_object_no_mapping_of_the_mounted_file_bytes_equal(m):
    """load(): maps the object (no mapping of the mounted file), bytes equal"""
    a = weightfs.load(m.pub, numpy=True)
    assert a.tobytes() == m.data
    with open("/proc/self/maps") as f:
        maps = f.read()
    assert os.path.join(m.store, "objects") in maps and m.pub not in maps
    del a


def test_weightfsctl_stat_shows_the_direct_path_served(m):
    """weightfsctl stat: shows the direct path served"""
    r = subprocess.run([os.path.join(m.build, "weightfsctl"), "stat", m.mnt], capture_output=True, text=True)
    assert "direct path:        served" in r.stdout, r.stdout


def test_not_weightfs_open_object_enotsup_load_reads_it_no_warning(m):
    """not weightfs: open_object -> ENOTSUP; load() reads it, no warning"""
    with pytest.raises(OSError) as e:
        weightfs.open_object("/etc/passwd")
    assert e.value.errno == errno.ENOTSUP, e.value
    plain = os.path.join(m.work, "plain.bin")
    with open(plain, "wb") as f:
        f.write(m.data[:4096])
    werrors._reset_warnings()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert weightfs.load(plain, numpy=True).tobytes() == m.data[:4096]
    assert not [x for x in w if issubclass(x.category, weightfs.WeightfsWarning)]


def test_nobody_own_open_fails_forged_descriptors_refused_a_readable_one_works(m, sock):
    """nobody: own open of a 0600 file fails; forged descriptors refused; a readable one works"""
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                        "-c", NOBODY, m.mnt, sock], capture_output=True, text=True, cwd="/")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["open"] == errno.EACCES, out
    assert out["passwd"] == [errno.EXDEV, 0], out  # another filesystem: no descriptor back
    assert out["o_path"] == [errno.EACCES, 0], out  # O_PATH proves no read permission
    assert out["pub"][0] == 0 and out["pub"][1] == 1, out


def test_malformed_requests_two_descriptors_a_long_message_a_wrong_magic_eproto(m, sock):
    """malformed requests: two descriptors, a long message, a wrong magic -> EPROTO"""
    fd1, fd2 = os.open(m.pub, os.O_RDONLY), os.open(m.pub, os.O_RDONLY)
    try:
        assert forge(sock, [fd1, fd2]) == errno.EPROTO
        assert forge(sock, [fd1], struct.pack("<III", MAGIC, 1, 0)) == errno.EPROTO
        assert forge(sock, [fd1], struct.pack("<II", 0x1234, 1)) == errno.EPROTO
        assert forge(sock, [fd1]) == 0
    finally:
        os.close(fd1)
        os.close(fd2)


@pytest.mark.parametrize("op", ["set", "remove"])
def test_xattr_user_weightfs_direct_cannot_be_set_or_removed(m, op):
    """xattr: user.weightfs.direct cannot be set or removed"""
    with pytest.raises(OSError) as e:
        if op == "set":
            os.setxattr(m.pub, "user.weightfs.direct", b"@x")
        else:
            os.removexattr(m.pub, "user.weightfs.direct")
    assert e.value.errno == errno.EPERM, e.value


# What `nobody` runs against the socket for SECONDS: connections opened as fast as it can, none of
# which sends a request, the last 900 kept open (it has 1,024 descriptors). Prints how many it made.
IDLER = r"""
import collections, json, socket, sys, time
name, seconds = sys.argv[1], float(sys.argv[2])
held, made, end = collections.deque(), 0, time.monotonic() + seconds
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(0.5)
    try:
        s.connect("\0" + name)
        made += 1
    except OSError:
        s.close()
        continue
    held.append(s)
    if len(held) > 900:
        held.popleft().close()
print(json.dumps({"made": made}))
"""


def test_another_user_s_idle_connections_do_not_delay_requests(m, sock, note):
    """another user's stream of idle connections: requests are still answered at once"""
    idler = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                              "-c", IDLER, sock, "8"], stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        time.sleep(1.5)  # past the daemon's 256 connections, and its 2 s idle limit nearly
        waits = []
        while idler.poll() is None and len(waits) < 200:
            t0 = time.monotonic()
            fd = weightfs.open_object(m.pub)
            waits.append(time.monotonic() - t0)
            os.close(fd)
            time.sleep(0.02)
        out, _ = idler.communicate(timeout=30)
    finally:
        if idler.poll() is None:
            idler.kill()
            idler.wait()
    # Before, four threads each waited up to 2 s on one connection: requests waited as long as the
    # stream lasted. An answer takes milliseconds; 2 s leaves room for a loaded machine.
    assert len(waits) >= 50 and max(waits) < 2.0, (len(waits), sorted(waits)[-5:])
    made = json.loads(out)["made"]
    note(f"{made} idle connections in 8 s; {len(waits)} requests beside them, slowest "
         f"{max(waits) * 1000:.1f} ms, median {sorted(waits)[len(waits) // 2] * 1000:.1f} ms")
    assert made > 256, made  # it did fill the daemon's table: the eviction was exercised


def test_a_connection_without_a_request_is_closed_after_2_s(m, sock):
    """a connection that sends no request is closed after about 2 s (the client sees the end)"""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    t0 = time.monotonic()
    s.connect("\0" + sock)
    try:
        assert s.recv(16) == b""
        waited = time.monotonic() - t0
    finally:
        s.close()
    assert 1.5 <= waited < 6, waited
    fd = os.open(m.pub, os.O_RDONLY)
    try:
        assert forge(sock, [fd]) == 0  # and the next is answered
    finally:
        os.close(fd)


def test_a_fifo_in_the_mount_open_object_refuses_at_once_einval(m):
    """a FIFO in the mount: open_object refuses at once (EINVAL), never waits for a writer"""
    fifo = os.path.join(m.mnt, "fifo")
    os.mkfifo(fifo)
    t0 = time.monotonic()
    try:
        with pytest.raises(OSError) as e:
            weightfs.open_object(fifo)
        assert e.value.errno == errno.EINVAL, e.value
        assert time.monotonic() - t0 < 5
    finally:
        os.unlink(fifo)


def test_being_written_ebusy_load_reads_the_mounted_file_with_one_warning(m):
    """being written: EBUSY; load() reads the mounted file with one warning"""
    p = os.path.join(m.mnt, "busy")
    wfd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(wfd, m.data[:8192])
        with pytest.raises(OSError) as e:
            weightfs.open_object(p)
        assert e.value.errno == errno.EBUSY, e.value
        werrors._reset_warnings()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(3):
                assert weightfs.load(p, numpy=True).tobytes() == m.data[:8192]
        msgs = [str(x.message) for x in w if issubclass(x.category, weightfs.WeightfsWarning)]
        assert len(msgs) == 1 and "being written" in msgs[0], msgs
    finally:
        os.close(wfd)


# ---- unmount and remount ----------------------------------------------------------------------

def test_a_descriptor_from_the_direct_path_outlives_unmount(m):
    """a descriptor from the direct path outlives unmount"""
    keep = weightfs.open_object(m.pub)
    try:
        m.umount()
        assert os.pread(keep, len(m.data) + 1, 0) == m.data
    finally:
        os.close(keep)
        if not os.path.ismount(m.mnt):
            m.mount()


def test_damaged_object_after_a_remount_open_object_and_load_eio_quarantined(m):
    """damaged object after a remount: open_object and load -> EIO, quarantined"""
    # Damage dmg's object behind the daemon's back, then mount: not verified by this daemon yet.
    body = m.data[: 4 * MIB]
    m.put("dmg", body)
    m.umount()
    h = weightfs.digest(body)
    obj = os.path.join(m.store, "objects", h[:2], h[2:])
    try:
        with open(obj, "r+b") as f:
            f.seek(12345)
            b = f.read(1)
            f.seek(12345)
            f.write(bytes([b[0] ^ 0xFF]))
    finally:
        m.mount()
    for fn in (weightfs.open_object, lambda p: weightfs.load(p, numpy=True)):
        with pytest.raises(OSError) as e:
            fn(os.path.join(m.mnt, "dmg"))
        assert e.value.errno == errno.EIO, e.value
    assert not os.path.exists(obj)
    q = os.listdir(os.path.join(m.store, "quarantine"))
    assert len(q) == 1, q
    assert weightfs.load(m.pub, numpy=True).tobytes() == m.data  # the others still work


# ---- page-cache footprint: 4 names, one content, read in full ---------------------------------

SAME_BYTES = 64 * MIB


@pytest.fixture(scope="module")
def same4(m):
    """MNT/same0..3: one 64 MiB content under 4 names."""
    body = os.urandom(SAME_BYTES)
    return body, [m.put(f"same{i}", body) for i in range(4)]


def grow(m, same4, direct):
    """Page-cache growth (meminfo Cached, bytes) of reading the 4 names in full after a remount and a
    drop of the caches, through the direct path or (WEIGHTFS_DIRECT=0) the mounted files."""
    body, names = same4
    os.environ["WEIGHTFS_DIRECT"] = "1" if direct else "0"
    try:
        m.umount()
        m.mount()
        wfstest.drop_caches()
        before = wfstest.cached_bytes()[0]
        maps = [weightfs.load(p, numpy=True) for p in names]
        assert all(int(a[::4096].sum() >= 0) for a in maps)
        assert all(a.tobytes() == body for a in maps)
        after = wfstest.cached_bytes()[0]
        del maps
        return after - before
    finally:
        os.environ.pop("WEIGHTFS_DIRECT", None)
        if not os.path.ismount(m.mnt):
            m.mount()


def test_footprint_4_names_x_64_mib_through_the_direct_path_cache_one_copy(m, same4, note):
    """footprint: 4 names x 64 MiB through the direct path cache one copy"""
    # Cached is the whole machine's: another process reading files meanwhile only adds to it, so
    # the least of up to three tries is the measure (one try failed beside a busy neighbour).
    tries = []
    while len(tries) < 3 and (not tries or min(tries) >= 1.6 * SAME_BYTES):
        tries.append(grow(m, same4, True))
    note("direct: Cached +" + ", ".join(f"{g / MIB:.1f}" for g in tries) + " MiB for 4 x 64 MiB")
    assert min(tries) < 1.6 * SAME_BYTES, tries


def test_footprint_the_mounted_files_without_passthrough_about_four_copies(m, same4, note, mount_opts):
    """footprint: the same through the mounted files without passthrough: about four copies"""
    if "passthrough=off" not in mount_opts:
        pytest.skip("measured without passthrough only (--mount-opts=passthrough=off)")
    g = grow(m, same4, False)
    note(f"mounted, passthrough off: Cached +{g / MIB:.1f} MiB for 4 x 64 MiB")
    assert g > 2.5 * SAME_BYTES, g
