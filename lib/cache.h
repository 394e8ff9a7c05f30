/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Host page cache of a set of weightfs names: drop it, load it (on a NUMA node), measure it.
 *
 * Why object files. Under FUSE passthrough the pages of a mounted file belong to its backing file,
 * the object STORE/objects/ab/<30 hex> named by the file's digest (user.weightfs.digest): the mounted
 * inode has no page cache of its own, so posix_fadvise(DONTNEED) on it frees nothing. This module
 * finds each name's object (the digest, and the store: the mount's source, lib/mounts.h) and acts on
 * the object file. Every name with that content shares those pages: dropping one drops
 * them for all, and residency is counted once per object.
 *
 * Identifiers. A set (struct wfs_cache_set) holds groups, one per path added (a file, a directory or
 * a rank's tree, walked), and the distinct objects below them. Each object is opened once, when it
 * is added; the set owns those descriptors until wfs_cache_set_free().
 *
 * Access. The store is mode 0700: only its owner (the mounting user) and root open object files.
 * For another user each object comes through the daemon's direct path (lib/direct.h: the caller opens
 * the name under the mount's permissions, the daemon hands back the object's descriptor); when that
 * fails too, wfs_cache_set_add() gives WFS_CACHE_ESTORE (-EACCES) with a message that says why.
 *
 * Rules of the kernel this module cannot change:
 *  1. Pages mapped by some process (a torch.from_file tensor, an mmap) are not dropped by DONTNEED;
 *     wfs_cache_drop() reports what stayed resident.
 *  2. Page placement is decided when a page is allocated, by the allocating thread's memory policy;
 *     pages already cached stay where they are. wfs_cache_load() allocates on the requested node only
 *     the pages it reads in: drop first to move a file.
 *
 * Thread-safety: a set may be read (status, drop, load) from several threads at once; adding to it
 * must not race with any other call on it. A load handle is polled and waited from any thread, and
 * freed once, after wfs_cache_load_wait().
 */
#ifndef WFS_CACHE_H
#define WFS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WFS_CACHE_MAX_NODES 64
#define WFS_CACHE_ESTORE (-13) /* -EACCES: the store's object files cannot be opened by this user */

struct wfs_cache_set;
struct wfs_cache_load;

/* Page-cache residency of an object, a group or a set (bytes; a partly resident last page counts whole). */
struct wfs_cache_residency {
	uint64_t bytes;                              /* object bytes (each distinct object once) */
	uint64_t resident_bytes;                     /* of those, in the page cache (mincore) */
	uint64_t node_bytes[WFS_CACHE_MAX_NODES];    /* resident bytes per NUMA node (move_pages) */
	uint64_t unknown_node_bytes;                 /* resident, node not found (raced out, no NUMA) */
};

/* One path added to a set. lib/python/weightfs/cache.py mirrors it (_Group): change both. */
struct wfs_cache_group {
	const char *path;  /* as given to wfs_cache_set_add(); owned by the set */
	uint64_t files;    /* regular files below it (the path itself when it is one) */
	uint64_t unsealed; /* of those, without a digest (being written): skipped */
	uint64_t objects;  /* distinct objects below it */
	uint64_t unreadable; /* files not readable by the caller (EACCES on their digest): skipped */
	uint64_t unreadable_dirs; /* directories below it the caller may not list or search (EACCES on
				     opendir, or on lstat of their entries): skipped with all they hold,
				     which no other count includes */
	uint64_t damaged;  /* files whose digest reads EIO (their object is quarantined or missing: the
			      name fails until written again): skipped */
};

/* A new, empty set into *@out. Returns 0 or -ENOMEM. Free it with wfs_cache_set_free(). */
int wfs_cache_set_new(struct wfs_cache_set **out);
void wfs_cache_set_free(struct wfs_cache_set *set);

/*
 * Add @path (a file or directory on a fuse.weightfs mount; directories are walked, symlinks not
 * followed) as a new group, and open every object below it not in the set yet. Files and directories
 * below @path that the caller cannot read are skipped and counted (the group's unreadable and
 * unreadable_dirs), and so are damaged files (EIO on their digest: the group's damaged), not errors. On failure nothing is added and @err (@errlen bytes) names the path
 * and the reason. Returns 0, or:
 * -ENOENT and other -errno of lstat/opendir/getxattr (-EACCES: @path is a directory the caller
 * cannot list or search); -EMEDIUMTYPE (not on a weightfs mount); WFS_MOUNTS_EHIDDEN (-EREMOTE: the
 * mount's store is not visible from this mount namespace, wfs_mounts_store_visible());
 * WFS_CACHE_ESTORE (object files not readable by this user: the store is private to its owner);
 * -ENOMEM.
 */
int wfs_cache_set_add(struct wfs_cache_set *set, const char *path, char *err, size_t errlen);

/* Groups in the set (in the order added) and distinct objects. @i < wfs_cache_set_groups(). */
size_t wfs_cache_set_groups(const struct wfs_cache_set *set);
const struct wfs_cache_group *wfs_cache_set_group(const struct wfs_cache_set *set, size_t i);
size_t wfs_cache_set_objects(const struct wfs_cache_set *set);

/*
 * Residency of group @group (or, for @group == SIZE_MAX, of the whole set: each object once) into
 * *@out, with per-node bytes when @per_node (maps each object and touches its resident pages to
 * ask their node: no I/O for pages that are resident, readahead is off). Returns 0, -EACCES (this user
 * neither owns nor may write an object: mincore would report all its pages resident, so it is not
 * measured), or -errno of mmap/mincore (the first; that object is counted as not resident).
 */
int wfs_cache_status(const struct wfs_cache_set *set, size_t group, bool per_node,
		     struct wfs_cache_residency *out);

/*
 * Add the residency of the first @bytes of file @fd (any file: an object, a plain file) to *@r
 * (bytes, resident_bytes and, with @per_node, the per-node counts as wfs_cache_status()). Returns 0
 * or -errno of mmap/mincore; -ENOMEM.
 */
int wfs_cache_residency_fd(int fd, uint64_t bytes, bool per_node, struct wfs_cache_residency *r);

/* A resident byte count this user cannot know (mincore lies to it: wfs_cache_status's -EACCES). */
#define WFS_CACHE_UNKNOWN UINT64_MAX

/*
 * Drop the page cache of every object of the set (and of the mounted names themselves, for a mount
 * without passthrough). Mapped pages stay (rule 1). @before/@after (either may be NULL) get the
 * resident bytes before and after, or WFS_CACHE_UNKNOWN when this user cannot measure them (objects
 * of the mounting user reached through the direct path: mincore reports their pages as all resident
 * to others). Returns 0 or the first -errno of fadvise.
 */
int wfs_cache_drop(const struct wfs_cache_set *set, uint64_t *before, uint64_t *after);

/* How wfs_cache_read_fd() and wfs_cache_load() place the pages they read in. */
enum wfs_cache_policy {
	WFS_CACHE_PREFERRED = 0, /* MPOL_PREFERRED: the node first, elsewhere when it is full */
	WFS_CACHE_BIND = 1,      /* MPOL_BIND: the node only (reclaim there before spilling: never) */
};

/*
 * Read @bytes of @fd from offset 0 into the page cache on the calling thread with memory policy
 * @policy for NUMA node @node (-1: the thread's policy as it is, no binding), restoring the thread's
 * policy after. @seen_mode/@seen_node (either may be NULL) get the policy in force during the read
 * (get_mempolicy: MPOL_* and its first node, -1 for none). Returns 0, -EINVAL (@node does not exist),
 * -ENOSYS (no NUMA support), or -errno of pread/set_mempolicy.
 */
int wfs_cache_read_fd(int fd, uint64_t bytes, int node, enum wfs_cache_policy policy, int *seen_mode,
		      int *seen_node);

/*
 * Start loading every object of @set into the page cache: @threads threads (0: 4), each bound to
 * @node (numa_run_on_node and the memory policy; -1: unbound) read whole objects. Returns at once:
 * 0 with a handle in *@out, -EINVAL (bad node), -ENOMEM, or -errno of pthread_create. The set must
 * outlive the handle.
 */
int wfs_cache_load_start(const struct wfs_cache_set *set, int node, enum wfs_cache_policy policy,
			 unsigned threads, struct wfs_cache_load **out);
/* Progress: bytes read so far and in all into @done/@total (either may be NULL); true when finished. */
bool wfs_cache_load_poll(struct wfs_cache_load *load, uint64_t *done, uint64_t *total);
/* Wait for the load to finish. Returns 0, or the first -errno a thread met (with @err naming the object). */
int wfs_cache_load_wait(struct wfs_cache_load *load, char *err, size_t errlen);
/* Free a handle after wfs_cache_load_wait(). */
void wfs_cache_load_free(struct wfs_cache_load *load);

/*
 * The NUMA node of CUDA device @device (the CUDA runtime's PCI bus id, then sysfs, as lib/stage.c
 * does). Returns the node, -1 when the device reports none, -ENODEV (no such device, built without
 * CUDA, or no CUDA runtime to load: lib/cudart.h).
 */
int wfs_cache_numa_node_of_device(int device);

/*
 * The NUMA node of the CPU thread @tid last ran on (/proc/TID/stat field 39 and numa_node_of_cpu()):
 * where a process's page faults allocate by default. -1 when NUMA is not available, or @tid is gone.
 */
int wfs_cache_node_of_task(pid_t tid);

/* Highest NUMA node of this machine (0 when NUMA is not available). */
int wfs_cache_max_node(void);

#endif
