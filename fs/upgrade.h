/* SPDX-License-Identifier: Apache-2.0 */
/*
 * upgrade — the binary that serves a mount replaced by another without unmounting (-o holder;
 * docs/design.md, "Upgrade").
 *
 * `weightfsctl upgrade MNT [--binary PATH]` asks the mount's holder (holder.h) over the UNIX socket
 * STORE/WFS_UPGRADE_SOCKET; then, in order:
 *   1. the holder checks PATH (an absolute path of an executable regular file) and sends SIGUSR2
 *      to the server, with the bound on the wait for writers, in ms, as the signal's value
 *      (sigqueue(3); a plain kill(1) means WFS_UPGRADE_WAIT_MS);
 *   2. the server drains (wfs_upgrade_server_start()'s thread): creates and opens for writing are
 *      left unanswered (the kernel keeps them, and the successor's FUSE_NOTIFY_RESEND puts them
 *      back: receive.h), and the files already open for writing get up to that bound to be closed,
 *      sealed as always. Then every request is left, the requests in progress are finished (up to
 *      WFS_UPGRADE_QUIET_MS), the catalog and the seals made durable (-o sync), and the server
 *      exits with status WFS_UPGRADE_EXIT. A file still open for writing at that point is adopted
 *      by the next server, as after a crash (its version is kept: fs/core/keep.h);
 *   3. the holder forks and executes PATH as the next server (wfs_upgrade_exec()), which inherits
 *      the /dev/fuse descriptor, the takeover region (takeover.h) and the store's locked STORE/lock,
 *      and takes the connection over as a crash's successor does; its INIT reply must be the one
 *      the kernel got, byte for byte, and the region's layout this build's;
 *   4. the new server tells the holder it answers (SIGUSR2, takeover.h): the upgrade is done, and
 *      later successors (a crash) run PATH too. A new server that ends before (it refused, its
 *      binary would not run, it crashed) or does not answer within WFS_UPGRADE_START_S is followed
 *      by the binary that served before. The holder logs every upgrade in STORE/weightfs.log with
 *      both pids and both binaries, and answers the client.
 * The socket accepts the mount's owner (the holder's uid) and root (SO_PEERCRED).
 *
 * Protocol on the socket: the client writes one line "upgrade WAIT_MS PATH\n" (WAIT_MS: decimal,
 * up to WFS_UPGRADE_WAIT_MAX_MS); the holder answers one line and closes:
 *   "ok\tOLD_PID\tNEW_PID\tDRAIN_MS\tPAUSE_MS\tWRITERS_CLOSED\tWRITERS_LOST\tOLD_PATH\tNEW_PATH\t
 *    WRITERS_ADOPTED\n" (one line)
 *   "refused\tMESSAGE\n"   nothing changed, the old binary serves (again)
 * DRAIN_MS: from the request to the server's stop (new opens for writing waited that long);
 * PAUSE_MS: from the server's stop to the new one answering (every request waited that long).
 * WRITERS_CLOSED: files open for writing closed while the drain waited (sealed as always); of those
 * still open at the stop, WRITERS_ADOPTED the new server adopted (their writes and close go on) and
 * WRITERS_LOST it could not (EIO; struct wfs_takeover_serving). Without WRITERS_ADOPTED (9 fields:
 * a holder, or a new server, of a build before it), WRITERS_LOST is what the holder could tell:
 * those not adopted, or every writer still open at the stop. A client of such a build reads the
 * first 9 fields and ignores the 10th.
 */
#ifndef WFS_UPGRADE_H
#define WFS_UPGRADE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define WFS_UPGRADE_SOCKET "holder.sock"
#define WFS_UPGRADE_EXIT 76             /* a server that drained for an upgrade exits so */
#define WFS_UPGRADE_WAIT_MS 10000       /* default bound on the wait for writers to close */
#define WFS_UPGRADE_WAIT_MAX_MS 3600000 /* the largest bound a client may ask for */
#define WFS_UPGRADE_QUIET_MS 5000       /* bound on the requests in progress at the stop */
#define WFS_UPGRADE_START_S 30          /* a new server that does not answer by then is killed */

struct wfs_fs;

/* ---- the server ------------------------------------------------------------------------------ */

/*
 * Under a holder: handle SIGUSR2 (an async-signal-safe handler that wakes a drain thread started
 * here) as step 2 above, and unblock it (the holder forks each server with SIGUSR2 blocked, so
 * that one sent while the server starts waits for this). Call from the thread that sets up the
 * session, once the receive path is installed, before the session loop. Returns
 * 0, -ENOTSUP without the daemon's receive path (it cannot leave requests unanswered: logged, an
 * upgrade then times out and the server keeps serving), or -errno of pthread_create or sigaction.
 */
int wfs_upgrade_server_start(struct wfs_fs *fs);
/* ops.c: this server answered an open for writing, and released one of its own (one atomic each). */
void wfs_upgrade_writer_opened(void);
void wfs_upgrade_writer_released(void);

/*
 * A server started by wfs_upgrade_exec(): what the holder handed it, from the environment
 * (WFS_UPGRADE_FDS, WFS_UPGRADE_STORE, WFS_UPGRADE_MOUNT, WFS_UPGRADE_HOLDER, removed from it here).
 * Returns 1 with *@out filled (its strings are the caller's: wfs_upgrade_inherited_free()), 0 when
 * this process was not started so, -EINVAL when the variables are malformed or a descriptor is not
 * open, -ECHILD when this process is not the holder's child (WFS_UPGRADE_HOLDER names another
 * parent: a wrapper script ran weightfs without exec, and the holder's signals would reach the
 * script, not this server).
 */
struct wfs_upgrade_inherited {
	int devfd;          /* the connection's /dev/fuse descriptor */
	int region_fd;      /* the takeover region (wfs_takeover_attach()) */
	int lock_fd;        /* STORE/lock, flock()ed by the holder's open file description */
	const char *store;  /* absolute */
	const char *mount;  /* absolute */
};
int wfs_upgrade_inherited(struct wfs_upgrade_inherited *out);
/* Free the strings wfs_upgrade_inherited() put in *@u (none: nothing to do). */
void wfs_upgrade_inherited_free(struct wfs_upgrade_inherited *u);
/*
 * A server started by wfs_upgrade_exec() that stops on a signal (the holder's SIGTERM): detach the
 * mount at @mountpoint as libfuse does for the server that mounted (umount2 MNT_DETACH, else
 * fusermount3 -u -z). Failures are logged.
 */
void wfs_upgrade_unmount(const char *mountpoint);

/* ---- the holder ------------------------------------------------------------------------------ */

/*
 * Listen on STORE/WFS_UPGRADE_SOCKET (@store absolute; a stale socket file is replaced; mode 0600).
 * Returns the listening descriptor (non-blocking, close-on-exec; the caller owns it), or -errno.
 */
int wfs_upgrade_listen(const char *store);
/* Remove the socket file of @store (the holder ends). */
void wfs_upgrade_unlisten(const char *store);

/*
 * Accept one client on @lfd and read its request: the path of the new binary into @binary
 * (@binary_bytes bytes) and the bound in *@wait_ms. Returns the client's descriptor (the caller
 * owns it and answers with wfs_upgrade_answer()), -EAGAIN when nobody was waiting, -EPERM (a
 * client that is neither root nor the holder's user: answered and closed here), -EPROTO (a
 * malformed request: answered and closed here), or -errno of accept4(2).
 */
int wfs_upgrade_accept(int lfd, char *binary, size_t binary_bytes, uint32_t *wait_ms);
/* Write one answer line (printf(3)'s @fmt, without the newline) to client @cfd and close it. */
__attribute__((format(printf, 2, 3))) void wfs_upgrade_answer(int cfd, const char *fmt, ...);
/*
 * Can @binary be started as a server? An absolute path of an executable regular file. Returns 0,
 * or -errno with a reason (one phrase) in @why (@why_bytes bytes).
 */
int wfs_upgrade_check_binary(const char *binary, char *why, size_t why_bytes);

/*
 * In the holder's child just forked: execute @binary as the next server with @argv (the holder's
 * own arguments; argv[0] replaced), handing it @devfd, the takeover region and @lock_fd, and
 * @store and @mount (absolute). @binary_fd (-1: none) is @binary as the holder opened it when the
 * upgrade was asked (O_PATH): that file is executed (fexecve(3)), whatever the path names since —
 * a package removed or replaced on the disk leaves the successors of a crash the binary that was
 * checked; a script, which cannot be executed so, runs from its path. Never returns: when the exec
 * fails, logs why and exits with WFS_UPGRADE_EXEC_FAILED.
 */
#define WFS_UPGRADE_EXEC_FAILED 127
__attribute__((noreturn)) void wfs_upgrade_exec(const char *binary, int binary_fd, char *const argv[], int devfd,
						 int lock_fd, const char *store, const char *mount);

#endif
