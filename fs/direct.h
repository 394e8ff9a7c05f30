/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's side of the direct path (lib/direct.h has the protocol and the permission argument).
 *
 * One poller thread accepts every connection on one abstract-namespace SOCK_SEQPACKET socket and holds
 * it until its one request has arrived; four workers answer requests that have. Reads are bounded
 * (one request struct, one descriptor) and never wait: a connection without a request ties up no
 * thread, is closed after 2 s, and past 256 held the oldest of the user holding the most goes, so
 * no user's idle connections delay another's request (fs/direct.c has the numbers). Socket I/O
 * never runs with fs->lock held: the lock is taken only to find the inode, pin and verify its object
 * (verification drops it while hashing, as for an open), and to unpin.
 */
#ifndef WFS_FS_DIRECT_H
#define WFS_FS_DIRECT_H

#include <stdbool.h>
#include <stddef.h>

struct wfs_fs;

/*
 * Bind the socket and start the threads serving it for the mount at @mountpoint (an absolute path;
 * its st_dev is read by the first request, once the session loop runs). Sets fs->direct. Returns 0
 * or -errno (logged; the mount works without the direct path).
 */
int wfs_direct_start(struct wfs_fs *fs, const char *mountpoint);
/* Stop the threads and close the socket (after the session loop ended). Safe when never started. */
void wfs_direct_stop(struct wfs_fs *fs);
/* Whether the direct path is served. */
bool wfs_direct_served(struct wfs_fs *fs);
/*
 * The value of user.weightfs.direct: "@<abstract name>", @size bytes at @buf (none when 0), its length
 * in *@len. Returns 0, -ENODATA (not served), or -ERANGE (@size too small and not 0).
 */
int wfs_direct_xattr(struct wfs_fs *fs, char *buf, size_t size, size_t *len);

#endif
