/* SPDX-License-Identifier: Apache-2.0 */
/*
 * holder — the process that keeps a mount's FUSE connection alive while the servers that answer it
 * come and go (-o holder; docs/design.md, "Takeover").
 *
 * The connection lives while any descriptor of /dev/fuse for it is open. The process that mounted
 * keeps its descriptor and the store's lock (both inherited by every server it forks), forks the
 * server, and waits. It reads no request and touches no file: it is on no data path. When a server
 * ends:
 *   - exit status 0 (an unmount, or a stop it asked for by SIGTERM, SIGINT or SIGHUP), once the
 *     kernel's connection is gone (/dev/fuse polls POLLERR within WFS_HOLDER_ENDED_MS): the holder
 *     exits 0 too. Status 0 on a live connection (an upgrade to a binary that is no server, a
 *     server that left a lazily detached mount with files open) is a death, as below;
 *   - killed by a signal (kill -9, the OOM killer, an assertion's SIGABRT, a segfault) or any other
 *     status: the holder logs the death (pid, signal or status) and forks a successor at once,
 *     which takes the connection over (takeover.h) and logs its own pid, the dead one's and the
 *     pause;
 *   - status WFS_TAKEOVER_REFUSED (a successor that cannot take over: it logged why), no INIT saved
 *     yet, or WFS_HOLDER_DEATHS_MAX deaths in a row each within WFS_HOLDER_SHORT_S of its start:
 *     the holder logs that it gives up and exits 1, and the mount fails as it did before holders
 *     existed (ENOTCONN until fusermount3 -u).
 * Signals to the holder: SIGTERM, SIGINT and SIGHUP go on to the server (which unmounts and exits
 * 0); SIGUSR1 reopens the holder's log file and goes on to the server, which reopens its own;
 * SIGUSR2 is a successor saying it answers (takeover.h), which ends an upgrade.
 *
 * Upgrades (upgrade.h): the holder listens on STORE/WFS_UPGRADE_SOCKET. An upgrade asked there has
 * the server drain and exit with WFS_UPGRADE_EXIT, then starts the new binary as its successor;
 * from then on every successor runs that binary. A successor of the upgrade that ends before it
 * answers is followed by the binary that served before (not given up on), and the client is told.
 * The holder's own code is not replaced by an upgrade: it is this file, on no data path.
 */
#ifndef WFS_HOLDER_H
#define WFS_HOLDER_H

#define WFS_HOLDER_DEATHS_MAX 50 /* short-lived servers in a row before the holder gives up: a successor
				 * that dies at once on what it inherits (a resent request) loops at most
				 * this often, about 50 ms each; a test kills 20 in 10 s */
#define WFS_HOLDER_SHORT_S 10   /* a server that dies this soon after its start counts as short-lived */
#define WFS_HOLDER_ENDED_MS 1000 /* how long a server's exit 0 waits for the connection's end: the
				  * kernel aborts it before the server reads ENODEV, so at once */

/* What the holder keeps (strings and argv by reference, for the process's life). */
struct wfs_holder_args {
	const char *mountpoint; /* absolute */
	const char *store;      /* absolute */
	int devfd;              /* the connection's /dev/fuse descriptor */
	int lock_fd;            /* STORE/lock, flock()ed (wfs_store_lock_fd()) */
	char **argv;            /* the daemon's arguments as given, for a server of another binary */
};

/*
 * Become the holder of the mount @a describes and fork the first server. Returns 0 in every
 * server process forked from it (the first and each successor of this binary:
 * wfs_takeover_successor() tells which, and wfs_takeover_server_start() has run; a server of
 * another binary starts in its own main()), and never in the holder, which exits with
 * the last server's status. Returns -errno when no holder can be made (the shared region or the
 * first fork failed, logged): the caller then serves the mount itself, as without -o holder. Call
 * after fuse_daemonize() and before any thread is started or the catalog is opened.
 */
int wfs_holder_run(const struct wfs_holder_args *a);

#endif
