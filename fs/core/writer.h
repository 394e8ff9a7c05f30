/* SPDX-License-Identifier: Apache-2.0 */
/*
 * writer — whose close(2) ends the writing of a version. The kernel sends a FLUSH for every close,
 * so the daemon asks here, from the closing thread's id, whether that close is the writer's end:
 *   - a close that is not the writer's must not seal: a forked child exiting with an inherited
 *     descriptor, or a descriptor closed before any data was written (a shell's dup2 + close of a
 *     redirection, dd's O_TRUNC open, numpy.memmap closing its file while its mapping is filled,
 *     after sizing it with a one-byte write at its end: not data either, wfs_version_has_data());
 *     sealing there would replace a name's content with nothing before the writer wrote. Those
 *     versions are sealed by a later flush of the writer, or at release;
 *   - a process killed mid-write still closes its files on the way out; its bytes are not a
 *     finished tensor and must not be sealed under the name.
 * Thread ids are the kernel's (fuse_req_ctx()->pid). /proc is read each time, through descriptors of
 * the last threads' stat files kept open (writer.c); nothing read is cached. Thread-safe; call it
 * without fs->lock where the caller can (a read costs microseconds).
 */
#ifndef WFS_CORE_WRITER_H
#define WFS_CORE_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct wfs_version;

/*
 * The signal that killed the process of thread @tid, if it is exiting because of one (it closes its
 * files on the way out); 0 otherwise, or when @tid is gone or 0. The kernel sets the exit code before
 * it closes files (do_exit) and marks the task exiting: /proc/TID/stat fields 9 (flags, PF_EXITING)
 * and 52 (exit code).
 */
int wfs_writer_killed_by(pid_t tid);
/* Thread group (process) of thread @tid, or 0 when it is gone. */
pid_t wfs_writer_tgid(pid_t tid);
/*
 * Is group @gid thread @tid's: its fsgid @fsgid (the FUSE request's gid), or one of its
 * supplementary groups (/proc/TID/status "Groups:", what libfuse's fuse_req_getgroups() reads)?
 * false when @tid is gone (the set-group-ID bit a non-member would keep then goes). One /proc read
 * when @gid is not @fsgid.
 */
bool wfs_writer_in_group(pid_t tid, gid_t fsgid, gid_t gid);
/*
 * Does a flush by thread @flusher_tid end the writing of version @v, last written by thread
 * @writer_tid (0: not known)? Only when data were written, and the flusher is the writer or of its
 * process (when either is gone: yes, as close(2) promises). Takes @v's lock.
 */
bool wfs_writer_flush_ends(struct wfs_version *v, pid_t writer_tid, pid_t flusher_tid);
/*
 * Is a flush by thread @flusher_tid of version @v, which holds no data yet, the close of a killed
 * opener (@opener_tid: the thread that created or opened the file for writing; 0: not known)?
 * Returns the signal when the flusher's process is exiting by it and is the opener's process, else 0: a rank
 * killed between its create (or O_TRUNC open) and its first write, whose file must seal nothing
 * (a new name goes away, an existing one keeps its content) rather than an empty file. A forked
 * child's exit with an inherited descriptor is not the opener's. One /proc read when the flusher
 * is the opener, two more for another thread. Takes @v's lock.
 */
int wfs_writer_killed_before_data(struct wfs_version *v, pid_t opener_tid, pid_t flusher_tid);
/*
 * Does a live process that the process of thread @tid forked (a child, or a child's child) hold a
 * descriptor open for writing of inode @ino of the weightfs mounted on @mountpoint (any of its
 * mounts: bind mounts too)? Such a child inherited the killed process's open file description, goes
 * on writing through it, and its close, not the killed process's, ends the writing (ext4 keeps
 * what it writes). Reads /proc/self/mountinfo, every /proc/PID/stat (parents) and the descendants'
 * /proc/PID/fdinfo (its flags, mnt_id and ino lines): milliseconds, asked only at a killed
 * process's close. false when @tid is gone, or on any error. A descriptor passed to an unrelated
 * process (SCM_RIGHTS) is not seen.
 */
bool wfs_writer_forked_holder(pid_t tid, uint64_t ino, const char *mountpoint);

#endif
