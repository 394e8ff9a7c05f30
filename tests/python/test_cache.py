# SPDX-License-Identifier: Apache-2.0
"""weightfs.evict / prefetch / residency and FrozenOffload.evict / prefetch on a real mount (root).
Needs neither torch nor numpy. Prints one ok/FAIL line per check and "python-cache: N passed, N failed".
    usage: test_cache.py MOUNTPOINT"""
import os
import sys

import weightfs

mnt = sys.argv[1]
passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


N = 32 << 20
d = os.path.join(mnt, "pyrank0")
os.makedirs(d, exist_ok=True)
data = os.urandom(N)
for name in ("a", "b"):                       # two names, one object
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
fo = weightfs.FrozenOffload(os.path.join(mnt, "pyfo"), 0)
with open(os.path.join(fo.dir, "p"), "wb") as f:
    f.write(data[: N // 2])

r = weightfs.evict([d])
check("evict: one object for two names, nothing left", r.objects == 1 and r.resident_bytes_after == 0, r)
h = weightfs.prefetch(d, numa_node=0)
check("prefetch: returns a handle at once", isinstance(h, weightfs.Prefetch))
got = h.wait()
check("prefetch: wait() gives the bytes read, done() is true", got == N and h.done(), (got, h.done()))
st = weightfs.residency([os.path.join(d, "a"), d])
check("residency: per path and total, node 0", st["total"]["resident_bytes"] == N
      and st["total"]["node_resident_bytes"][0] == N and st["paths"][0]["objects"] == 1, st["total"])
r = weightfs.evict(os.path.join(d, "a"))
st = weightfs.residency(os.path.join(d, "b"))
check("evict one name drops the other's copy", st["total"]["resident_bytes"] == 0, st["total"])
h = fo.prefetch(numa_node=0)
check("FrozenOffload.prefetch + wait", h.wait() == N // 2)
r = fo.evict()
check("FrozenOffload.evict", r.objects == 1 and r.resident_bytes_before == N // 2 and r.resident_bytes_after == 0, r)
try:
    weightfs.evict("/")
    check("evict outside a mount raises", False)
except OSError as e:
    check("evict outside a mount raises OSError naming it", "not on a weightfs mount" in str(e), e)
try:
    weightfs.prefetch(d, numa_node=999)
    check("prefetch on a missing node raises", False)
except OSError as e:
    check("prefetch on a missing node raises EINVAL", e.errno == 22, e)
print(f"python-cache: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
