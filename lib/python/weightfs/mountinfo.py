# SPDX-License-Identifier: Apache-2.0
"""Which filesystem holds a path: /proc/self/mountinfo, parsed."""

import os
import re
from typing import Dict, Optional

from ._types import PathLike

__all__ = ["fs_type"]


def _mounts():
    """(major:minor, mount point, filesystem type) of each mount, from /proc/self/mountinfo (mount
    points unescaped); [] when it cannot be read."""
    out = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or not right:
                    continue
                mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
                out.append((fields[2], mnt, right.split()[0]))
    except OSError:
        pass
    return out


def fs_type(path: PathLike) -> Optional[str]:
    """The filesystem type of the mount holding path ('fuse.weightfs', 'ext4', ...), or None when
    it cannot be told."""
    real = os.path.realpath(path)
    best, best_type = "", None
    for _, mnt, kind in _mounts():
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, best_type = mnt, kind
    return best_type


_weightfs_devs: Dict[int, bool] = {}  # st_dev -> is it a weightfs mount


def _is_weightfs(dev):
    """Is device dev (a file's st_dev) a weightfs mount? Asked of _mounts() once per device; False
    when it cannot be told."""
    known = _weightfs_devs.get(dev)
    if known is None:
        want = f"{os.major(dev)}:{os.minor(dev)}"
        known = any(dn == want and kind == "fuse.weightfs" for dn, _, kind in _mounts())
        _weightfs_devs[dev] = known
    return known
