/* SPDX-License-Identifier: Apache-2.0 */
/*
 * closing — what a close(2) (the kernel's FLUSH) or the kernel's RELEASE of a writable handle means
 * for the version it writes: the one owner of the rule "when does a close seal a file, and with what".
 *
 * The rule is one pure function, wfs_closing_decide(), of the facts of that close (struct
 * wfs_close_facts): which request it is, how the handle writes (daemon-served, or the kernel through
 * passthrough), whether this close ends the handle's writing, whether the closing process is being
 * killed, how many writers the version has and whether it is still the inode's, whether another writer
 * finished cleanly, and whether the version's size makes the declared dtype and shape. Facts that cost
 * a /proc read or a catalog read are asked for only when the answer depends on them: the function
 * returns WFS_CLOSE_ASK_KILLED or WFS_CLOSE_ASK_FITS, the caller fills the fact in and asks again.
 *
 *   FLUSH (close(2) returns what it says)              RELEASE (nobody hears an error)
 *   ─────────────────────────────────────              ──────────────────────────────
 *   not the end of the writing ....... KEEP, unless    not the last writer .............. LEAVE
 *     its opener is killed before data: as below
 *   killed, and a process it forked holds the
 *     descriptor still ................. KEEP (its close decides)
 *   passthrough: killed .............. DOOM (release   the size a close refused ......... ABANDON
 *                drops), or KEEP beside others           killed, nobody finished ......... ABANDON_UNLINK
 *                size does not fit ... REFUSE           otherwise ........................ SEAL
 *                otherwise ........... FINISH (the
 *                                      release seals)
 *   daemon: not the last writer ...... LEAVE(_FINISHED)
 *           killed, nobody finished .. ABANDON_UNLINK
 *           size does not fit ........ REFUSE
 *           otherwise ................ SEAL
 *
 * wfs_closing_flush() and wfs_closing_release() gather the facts, decide and carry the action out
 * (seal.h does the sealing and the dropping). They run with fs->lock held and may drop it (a /proc
 * read, a seal).
 */
#ifndef WFS_CORE_CLOSING_H
#define WFS_CORE_CLOSING_H

#include <stdbool.h>
#include <sys/types.h>

struct wfs_fs;
struct wfs_handle;
struct wfs_news;

/* The facts of one close of a handle that writes a version (its h->writing). */
struct wfs_close_facts {
	bool at_release;   /* the kernel's RELEASE; else a FLUSH, whose answer close(2) returns */
	bool passthrough;  /* the kernel writes the version's file: it may write until the release */
	bool ends;         /* FLUSH: this close ends the handle's writing (wfs_writer_flush_ends()) */
	bool opener_known; /* FLUSH: the thread that opened the handle for writing is known */
	bool current;      /* the version is still its inode's version (in->writer) */
	bool sealing;      /* a seal holds the version already (wfs_version_frozen()) */
	unsigned writers;  /* writers the version counts, this handle included */
	bool finished;     /* another writer's close ended cleanly (wfs_version_finished()) */
	bool refused;      /* RELEASE: a close refused the size the version still has */
	bool killed_known; /* @killed is filled in */
	int killed;        /* the signal killing the closing (at release: the last writing) process, 0 */
	bool fits_known;   /* @fits is filled in */
	bool fits;         /* the version's size makes the declared dtype and shape, or none is declared */
	bool forked_known; /* FLUSH: @forked is filled in */
	bool forked;       /* FLUSH: a live process that the killed one forked holds a writable descriptor
			    * of the file (writer.h, wfs_writer_forked_holder()): the same open file
			    * description, written on after this close */
};

enum wfs_close_action {
	WFS_CLOSE_ASK_KILLED,   /* fill in @killed (writer.h: a /proc read) and decide again */
	WFS_CLOSE_ASK_FITS,     /* fill in @fits (wfs_seal_fits(), which logs a refusal) and decide again */
	WFS_CLOSE_ASK_FORKED,   /* fill in @forked (writer.h: a /proc walk) and decide again */
	WFS_CLOSE_KEEP,         /* nothing changes: the handle still writes the version */
	WFS_CLOSE_FINISH,       /* passthrough: its writing ended well; the release seals */
	WFS_CLOSE_DOOM,         /* passthrough writer killed: the seal at the release fails, drops it */
	WFS_CLOSE_REFUSE,       /* EINVAL to close(2); the handle still writes (a dup may complete it) */
	WFS_CLOSE_LEAVE,        /* the handle stops writing; other writers go on */
	WFS_CLOSE_LEAVE_FINISHED, /* ... and its writing ended well: the version holds finished bytes */
	WFS_CLOSE_SEAL,         /* the last writer leaves: seal the version */
	WFS_CLOSE_ABANDON,      /* the last writer leaves: drop the version; the name keeps what it had */
	WFS_CLOSE_ABANDON_UNLINK, /* ... its writer was killed: a never-sealed (or never-filled) name goes */
};

/* The action for a close with facts @f (see the table above). Pure: reads @f only. */
enum wfs_close_action wfs_closing_decide(const struct wfs_close_facts *f);
/* A short name of @a, for logs and test messages ("seal", "abandon-unlink", ...). */
const char *wfs_closing_action_name(enum wfs_close_action a);

/*
 * close(2) of a descriptor of writable handle @h by thread @tid (FLUSH), after openmode.c counted
 * it closed. Returns 0, or the -errno close(2) returns: -EINVAL (the size does not make the
 * dtype/shape), or the seal's (-ENOSPC, -EIO, ...). @news: what the kernel must hear (a never-sealed
 * name removed, attributes the seal changed).
 */
int wfs_closing_flush(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, struct wfs_news *news);
/*
 * The kernel's RELEASE of @h (@tid: the thread it names, 0 for none): the handle's writing ends here
 * if no flush ended it (writes after the last close: a shared mapping's writeback, or a passthrough
 * writer's file). Returns 0 or the seal's -errno, which the caller logs (the kernel drops it).
 * @news may be NULL only for a handle that writes nothing (a read-only release under a lent
 * fs->lock, openmode.c): nothing is then done and nothing is told.
 */
int wfs_closing_release(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, struct wfs_news *news);

#endif
