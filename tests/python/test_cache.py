# SPDX-License-Identifier: Apache-2.0
"""weightfs.evict / prefetch / residency and FrozenOffload.evict / prefetch on a real mount (root).

    python3 -m pytest tests/python/test_cache.py [-k NAME] [--mnt MNT]

Run by tests/cli/test_cache.sh on its mount (--mnt), which adds these tests' counts to its own;
without --mnt, conftest.py mounts a fresh store. Needs neither torch nor numpy. Two names of one
32 MiB content (MNT/pyrank0/a and b) and a FrozenOffload file of half of it (MNT/pyfo/rank0/p). A
test that needs the bytes resident, or not, prefetches or evicts them itself first, so each runs
alone.
"""

import errno
import os

import pytest

import weightfs

N = 32 << 20


@pytest.fixture(scope="module")
def data():
    return os.urandom(N)


@pytest.fixture(scope="module")
def d(mnt, data):
    """MNT/pyrank0: two names, one object."""
    d = os.path.join(mnt, "pyrank0")
    os.makedirs(d, exist_ok=True)
    for name in ("a", "b"):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return d


@pytest.fixture(scope="module")
def fo(mnt, data):
    """A FrozenOffload directory with one file of N/2 bytes."""
    fo = weightfs.FrozenOffload(os.path.join(mnt, "pyfo"), 0)
    with open(os.path.join(fo.dir, "p"), "wb") as f:
        f.write(data[: N // 2])
    return fo


def test_evict_one_object_for_two_names_nothing_left(d):
    """evict: one object for two names, nothing left"""
    r = weightfs.evict([d])
    assert r.objects == 1 and r.resident_bytes_after == 0, r


def test_prefetch_returns_a_handle_at_once(d):
    """prefetch: returns a handle at once"""
    h = weightfs.prefetch(d, numa_node=0)
    assert isinstance(h, weightfs.Prefetch)
    h.wait()


def test_prefetch_wait_gives_the_bytes_read_done_is_true(d):
    """prefetch: wait() gives the bytes read, done() is true"""
    weightfs.evict([d])
    h = weightfs.prefetch(d, numa_node=0)
    got = h.wait()
    assert got == N and h.done(), (got, h.done())


def test_residency_per_path_and_total_node_0(d):
    """residency: per path and total, node 0"""
    weightfs.prefetch(d, numa_node=0).wait()
    st = weightfs.residency([os.path.join(d, "a"), d])
    assert st["total"]["resident_bytes"] == N and st["total"]["node_resident_bytes"][0] == N \
        and st["paths"][0]["objects"] == 1, st["total"]


def test_evict_one_name_drops_the_other_s_copy(d):
    """evict one name drops the other's copy"""
    weightfs.prefetch(d, numa_node=0).wait()
    weightfs.evict(os.path.join(d, "a"))
    st = weightfs.residency(os.path.join(d, "b"))
    assert st["total"]["resident_bytes"] == 0, st["total"]


def test_frozenoffload_prefetch_and_wait(fo):
    """FrozenOffload.prefetch + wait"""
    h = fo.prefetch(numa_node=0)
    assert h.wait() == N // 2


def test_frozenoffload_evict(fo):
    """FrozenOffload.evict"""
    fo.prefetch(numa_node=0).wait()
    r = fo.evict()
    assert r.objects == 1 and r.resident_bytes_before == N // 2 and r.resident_bytes_after == 0, r


def test_evict_outside_a_mount_raises_oserror_naming_it():
    """evict outside a mount raises OSError naming it"""
    with pytest.raises(OSError) as e:
        weightfs.evict("/")
    assert "not on a weightfs mount" in str(e.value), e.value


def test_prefetch_on_a_missing_node_raises_einval(d):
    """prefetch on a missing node raises EINVAL"""
    with pytest.raises(OSError) as e:
        weightfs.prefetch(d, numa_node=999)
    assert e.value.errno == errno.EINVAL, e.value
