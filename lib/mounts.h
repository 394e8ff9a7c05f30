/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mounts — the weightfs mounts of this process's mount namespace, as /proc/self/mounts lists them.
 *
 * A weightfs mount is an entry of type WFS_MOUNT_TYPE. The daemon mounts with fsname=STORE, so an
 * entry's source is the store it serves, as the resolved path the daemon was given. Mount points are
 * compared as strings with the entries as getmntent(3) gives them (octal escapes such as \040 undone):
 * callers pass resolved paths (realpath(3)). Stores are compared as strings too, or else by the
 * identity (st_dev, st_ino) of the directories the two paths name here: a store reached through a
 * bind mount or a symlink elsewhere is the same store. Entries come in mount order; of mounts stacked
 * on one directory the last is on top, the one a path lookup reaches.
 *
 * The entry's source is the daemon's path: in another mount namespace (a container given the mount
 * but not the store) that path may name nothing, or another directory. wfs_mounts_store_visible()
 * tells, by the store identity the daemon reports in its user.weightfs.stats.
 *
 * Each call reads the table afresh: a mount or unmount between two calls shows in the second.
 * Thread-safety: every function may be called from any thread.
 */
#ifndef WFS_MOUNTS_H
#define WFS_MOUNTS_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

#define WFS_MOUNT_TYPE "fuse.weightfs" /* the filesystem type of a weightfs mount */

/* One weightfs entry of the table; it and its strings live only during the callback that gets it. */
struct wfs_mount {
	const char *dir;   /* the mount point */
	const char *store; /* the store it serves: the entry's source */
};

/*
 * Call @fn(@ctx, m) for each weightfs entry of /proc/self/mounts, in mount order, until @fn returns
 * non-zero. Returns 0 when @fn saw every entry, @fn's non-zero value when it ended the walk, or
 * -ENOMEM, -errno of opening the table (-ENOENT: /proc is not mounted, -EACCES, -EMFILE), or -EIO when
 * reading it failed part way.
 */
int wfs_mounts_each(int (*fn)(void *ctx, const struct wfs_mount *m), void *ctx);

/*
 * The topmost weightfs mount on directory @dir: its store into @store (PATH_MAX bytes). Returns 0,
 * -ENOENT when there is none, or an error of wfs_mounts_each(). @store is meaningful only after 0.
 */
int wfs_mounts_on(const char *dir, char *store);

/*
 * Do paths @a and @b name one store directory: equal strings, or directories with the same st_dev and
 * st_ino here (stat(2), links followed)? False when either cannot be stat()ed and the strings differ.
 */
bool wfs_mounts_same_store(const char *a, const char *b);

/*
 * The first weightfs mount of store @store (wfs_mounts_same_store()): its mount point into @dir
 * (PATH_MAX bytes). With @live, only a mount whose daemon answers statfs(2): one whose daemon died
 * answers ENOTCONN and is passed over (and a hung daemon blocks this call). Returns 0, -ENOENT when
 * there is none, or an error of wfs_mounts_each(). @dir is meaningful only after 0.
 */
int wfs_mounts_of(const char *store, bool live, char *dir);

/*
 * The innermost weightfs mount that @path lies below (strictly: a mount point is not below itself,
 * but every path is below /), the topmost where mounts are stacked: its mount point into @dir and its
 * store into @store (PATH_MAX bytes each). Returns 0, -ENOENT when there is none, or an error of
 * wfs_mounts_each(). @dir and @store are meaningful only after 0.
 */
int wfs_mounts_below(const char *path, char *dir, char *store);

/*
 * Is @path (a resolved path) a weightfs mount point or inside one — a place no store may live (its
 * files would be that mount's, served by a daemon that reads /proc of the threads closing them:
 * two daemons seen deadlocked)? Its mount point into @dir (equal to @path for a mount point) and
 * that mount's store into @store (PATH_MAX bytes each). Returns 0, -ENOENT when it is neither, or
 * an error of wfs_mounts_each(). @dir and @store are meaningful only after 0.
 */
int wfs_mounts_holding(const char *path, char *dir, char *store);

/*
 * The innermost mount point that the fstab lists at or above @path (a resolved path, which need not
 * exist) when nothing is mounted there now: the filesystem that @path belongs on is absent (a disk
 * missing at boot), and what is at @path is the directory below it. Its mount point into @dir
 * (PATH_MAX bytes) and its source (UUID=..., /dev/...) into @source (PATH_MAX bytes). Not considered:
 * swap and other entries whose mount point is not an absolute path, "/", and weightfs mounts
 * (fuse.weightfs: a store inside one is refused on its own). The fstab is $WFS_FSTAB when set (tests),
 * else /etc/fstab; a missing one lists nothing. Mounted means a mount's root (statx(2)
 * STATX_ATTR_MOUNT_ROOT). Returns 0 (such an entry), -ENOENT (none, or it is mounted), or -ENOMEM,
 * -errno of reading the fstab.
 */
int wfs_mounts_fstab_absent(const char *path, char *dir, char *source);

/* wfs_mounts_store_visible(): the daemon's store is not the directory its path names here. */
#define WFS_MOUNTS_EHIDDEN (-EREMOTE)

/*
 * Is the store that the daemon of the weightfs mount at @dir serves reachable here at @store, its path
 * (the mount's source)? A process in another mount namespace may find nothing there, or another
 * directory (a container that was given the mount only; a tmpfs over the path). Compares @store's
 * st_dev and st_ino here with the "store_dev" and "store_ino" the daemon reports in the mount root's
 * user.weightfs.stats. A daemon that reports neither (older, dead, or not answering) cannot tell: then
 * only a missing @store (ENOENT, ENOTDIR) is hidden. One getxattr(2) of the stats: the daemon
 * totals its catalog for it (about 15 ms for 20,000 names), and a hung daemon blocks this call.
 * Returns 0 (visible, or it cannot be told), or WFS_MOUNTS_EHIDDEN.
 */
int wfs_mounts_store_visible(const char *dir, const char *store);

/*
 * The message for WFS_MOUNTS_EHIDDEN, one line into @out (@out_bytes bytes): "the store STORE is not
 * visible from this mount namespace (a container that sees the mount only): @needs needs the store's
 * directory; bind-mount it into the container at the same path, or run this on the host". Returns @out.
 */
const char *wfs_mounts_hidden_message(const char *store, const char *needs, char *out, size_t out_bytes);

#define WFS_MOUNT_DEV_BYTES 32 /* "MAJ:MIN" and its NUL */

/*
 * The device number of the topmost weightfs mount on directory @dir (a resolved path), as "MAJ:MIN"
 * into @dev: the name of its entry under /sys/class/bdi. From /proc/self/mountinfo, so the daemon can
 * ask it of its own mount without a stat(2) that it would have to answer itself. Returns 0, -ENOENT
 * (no such mount), or -errno of opening the table. @dev is meaningful only after 0.
 */
int wfs_mounts_device(const char *dir, char dev[WFS_MOUNT_DEV_BYTES]);

#endif
