/* SPDX-License-Identifier: Apache-2.0 */
/* closing.h: what a close or a release of a writable handle means for its version. */
#include <errno.h>
#include <string.h>

#include "closing.h"
#include "daemon.h"
#include "inode.h"
#include "log.h"
#include "object.h"
#include "openmode.h"
#include "seal.h"
#include "version.h"
#include "writer.h"

/*
 * A FLUSH by a killed process that would drop the version (the last writer, nobody finished): a
 * process it forked may hold the same open file description and write on (fork_kill: 100,000
 * bytes, then the child's 100 after the parent's death, then its close). That one's close decides.
 */
static enum wfs_close_action killed_unless_forked(const struct wfs_close_facts *f)
{
	if (!f->forked_known)
		return WFS_CLOSE_ASK_FORKED;
	if (f->forked)
		return WFS_CLOSE_KEEP;
	return f->passthrough ? WFS_CLOSE_DOOM : WFS_CLOSE_ABANDON_UNLINK;
}

enum wfs_close_action wfs_closing_decide(const struct wfs_close_facts *f)
{
	bool last = f->current && !f->sealing && f->writers == 1;

	if (!f->at_release) {
		/* A close before any data, or by another process than the writer's (a forked child, a
		 * shell's redirection): the writing goes on, unless the opener is being killed. (Through
		 * passthrough, data is what the file's size and blocks show: version.h.) */
		if (!f->ends && !f->opener_known)
			return WFS_CLOSE_KEEP;
		if (!f->killed_known)
			return WFS_CLOSE_ASK_KILLED;
		if (!f->ends && !f->killed)
			return WFS_CLOSE_KEEP;
		if (f->passthrough) {
			/* The kernel may write the file until the release, where the seal is: a close says
			 * only whether the bytes are finished. One finished writer, or others still writing,
			 * outweigh a killed one: the last release decides. */
			if (f->killed && (f->writers > 1 || f->finished))
				return WFS_CLOSE_KEEP;
			if (f->killed)
				return killed_unless_forked(f);
			if (!f->fits_known)
				return WFS_CLOSE_ASK_FITS;
			return f->fits ? WFS_CLOSE_FINISH : WFS_CLOSE_REFUSE;
		}
		if (!last) /* what it wrote is kept whatever becomes of the others (ext4 keeps it too) */
			return f->killed || !f->current ? WFS_CLOSE_LEAVE : WFS_CLOSE_LEAVE_FINISHED;
		if (f->killed && !f->finished)
			return killed_unless_forked(f);
		if (!f->fits_known)
			return WFS_CLOSE_ASK_FITS;
		return f->fits ? WFS_CLOSE_SEAL : WFS_CLOSE_REFUSE;
	}
	if (!f->killed_known)
		return WFS_CLOSE_ASK_KILLED;
	if (!last)
		return WFS_CLOSE_LEAVE;
	if (f->refused) /* the close that ended it heard why */
		return WFS_CLOSE_ABANDON;
	if (f->killed && !f->finished)
		return WFS_CLOSE_ABANDON_UNLINK;
	return WFS_CLOSE_SEAL; /* errors are logged: a size that does not fit is sealed all the same */
}

const char *wfs_closing_action_name(enum wfs_close_action a)
{
	static const char *const names[] = {
		[WFS_CLOSE_ASK_KILLED] = "ask-killed", [WFS_CLOSE_ASK_FITS] = "ask-fits",
		[WFS_CLOSE_ASK_FORKED] = "ask-forked",
		[WFS_CLOSE_KEEP] = "keep", [WFS_CLOSE_FINISH] = "finish", [WFS_CLOSE_DOOM] = "doom",
		[WFS_CLOSE_REFUSE] = "refuse", [WFS_CLOSE_LEAVE] = "leave",
		[WFS_CLOSE_LEAVE_FINISHED] = "leave-finished", [WFS_CLOSE_SEAL] = "seal",
		[WFS_CLOSE_ABANDON] = "abandon", [WFS_CLOSE_ABANDON_UNLINK] = "abandon-unlink",
	};

	return (unsigned)a < sizeof(names) / sizeof(names[0]) && names[a] ? names[a] : "?";
}

/* The facts of @h's close that cost nothing to read (fs->lock held). */
static struct wfs_close_facts facts_of(struct wfs_handle *h, bool at_release)
{
	struct wfs_version *v = h->writing;

	return (struct wfs_close_facts){
		.at_release = at_release,
		.passthrough = h->passthrough,
		.opener_known = h->opener_tid != 0,
		.current = h->inode->writer == v,
		.sealing = wfs_version_frozen(v),
		.writers = wfs_version_writers(v),
		.finished = wfs_version_finished(v),
		.refused = at_release && wfs_version_refused(v),
	};
}

/* Carry out @a for @h, whose version is @v (referenced by the caller), with facts @f. */
static int act(struct wfs_fs *fs, struct wfs_handle *h, struct wfs_version *v, const struct wfs_close_facts *f,
	       enum wfs_close_action a, struct wfs_news *news)
{
	struct wfs_inode *in = h->inode;
	unsigned long long ino = (unsigned long long)in->ino;
	const char *keeps = in->sealed ? ", the name keeps its previous content" : "";
	bool told;
	int ret = 0;

	switch (a) {
	case WFS_CLOSE_ASK_KILLED:
	case WFS_CLOSE_ASK_FITS:
	case WFS_CLOSE_ASK_FORKED:
	case WFS_CLOSE_KEEP:
		return 0;
	case WFS_CLOSE_FINISH:
		/* The kernel wrote the bytes: a store full as the writer closes, or found full while it
		 * was writing (another's close), means a write(2) may have failed with ENOSPC and cut the
		 * file short. close(2) says so too, and the release drops it (a new name goes), rather
		 * than keep a prefix sealed as if whole once another file's removal frees room. */
		if (wfs_seal_store_full(fs))
			wfs_seal_store_filled(fs); /* this one and every other kernel writer */
		if ((ret = wfs_version_failed(v)) != 0) {
			WFS_LOG_LIMITED(WFS_LOG_WARN, "inode %llu: written through the kernel while the store filled up: "
					"its writes may have failed with %s; not sealed%s", ino, strerror(-ret), keeps);
			return ret;
		}
		/* close(2) returns 0: the writing is done, whatever becomes of its writer before the
		 * release (a kill right after close must not drop the tensor; the release asks no /proc). */
		h->writer_tid = 0;
		wfs_version_finish(v);
		return 0;
	case WFS_CLOSE_DOOM:
		WFS_LOG_LIMITED(WFS_LOG_WARN, "inode %llu: writer killed by signal %d before it finished: nothing "
				"sealed%s", ino, f->killed, keeps);
		wfs_version_fail(v, -EINTR); /* the release drops it */
		wfs_seal_writer_doomed(fs, in, news);
		return 0;
	case WFS_CLOSE_REFUSE:
		wfs_version_refuse(v); /* logged by wfs_seal_fits(); the release drops it if still so */
		return -EINVAL;
	default:
		break;
	}
	/* The handle stops writing the version. */
	if (a == WFS_CLOSE_LEAVE_FINISHED)
		wfs_version_finish(v);
	h->writing = NULL;
	wfs_version_writer_drop(v);
	wfs_version_put(v); /* the handle's reference; the caller holds its own */
	switch (a) {
	case WFS_CLOSE_ABANDON:
		WFS_LOG_LIMITED(WFS_LOG_INFO, "inode %llu: released with the size its close refused: nothing sealed%s",
				ino, keeps);
		wfs_seal_abandon(fs, in);
		wfs_seal_writer_gone(fs, in, false, news);
		break;
	case WFS_CLOSE_ABANDON_UNLINK:
		if (!wfs_version_error_told(v)) /* else logged at its close (DOOM) */
			WFS_LOG_LIMITED(WFS_LOG_WARN, "inode %llu: writer killed by signal %d before it finished: "
					"nothing sealed%s", ino, f->killed, keeps);
		wfs_seal_abandon(fs, in);
		wfs_seal_writer_gone(fs, in, true, news);
		break;
	case WFS_CLOSE_SEAL:
		if (f->killed)
			WFS_LOG_LIMITED(WFS_LOG_WARN, "inode %llu: its last writer was killed by signal %d, after another "
					"writer's close(2) returned: sealed with what both wrote", ino, f->killed);
		told = wfs_version_error_told(v);
		ret = wfs_seal(fs, in, !f->at_release);
		if (ret == -EINTR || ret == -ENOSPC || (ret && !f->at_release)) {
			/* -EINTR: a passthrough writer killed at its close (DOOM); -ENOSPC: its write(2)
			 * said so; else close(2) reports it. A never-sealed name goes. */
			wfs_seal_writer_gone(fs, in, ret == -EINTR, news);
		} else if (ret) {
			/* At the release nobody hears it: a never-sealed name stays and reads EIO (its
			 * reads must not return bytes it does not hold). */
			news->ino = in->ino;
			news->inval = true;
			wfs_object_expect_end(fs, &in->expecting);
		} else if (news && wfs_inode_told_other(fs, in)) {
			/* A stat while it was written may have cached a size or times the seal moved:
			 * the kernel asks again. Not when nothing was told since a write(2), nor when
			 * what was told is what the seal gave (inode.h): an open + fstat right after
			 * close(2), and the next open's permission check, would cost a GETATTR for
			 * nothing. */
			news->ino = in->ino;
			news->inval_attr = true;
		}
		if (told && f->at_release)
			ret = 0; /* reported at the close, or logged when the writer was killed */
		break;
	default:
		break;
	}
	return ret;
}

/*
 * Decide for @h with facts @f, asking for what the decision needs, then act. @proc_tid: the thread
 * whose process's end is asked about; at a flush, @f->ends says which question (writer.h).
 */
static int decide_and_act(struct wfs_fs *fs, struct wfs_handle *h, struct wfs_close_facts *f, pid_t proc_tid,
			  struct wfs_news *news)
{
	struct wfs_version *v = h->writing;
	enum wfs_close_action a;
	int ret;

	wfs_version_get(v);
	while ((a = wfs_closing_decide(f)) == WFS_CLOSE_ASK_KILLED || a == WFS_CLOSE_ASK_FITS ||
	       a == WFS_CLOSE_ASK_FORKED) {
		if (a == WFS_CLOSE_ASK_FORKED) {
			/* Without fs->lock, as for the killed question below: a walk of /proc. */
			struct wfs_close_facts asked = *f;
			uint64_t ino = h->inode->ino;
			bool forked;

			wfs_unlock(&fs->lock);
			forked = wfs_writer_forked_holder(proc_tid, ino, fs->opt.mountpoint);
			wfs_lock(&fs->lock);
			if (h->writing != v) {
				wfs_version_put(v);
				return 0;
			}
			*f = facts_of(h, false);
			f->ends = asked.ends;
			f->killed = asked.killed;
			f->killed_known = true;
			f->forked = forked;
			f->forked_known = true;
			if (forked)
				WFS_LOG_LIMITED(WFS_LOG_INFO, "inode %llu: its writer was killed by signal %d; a "
						"process it forked holds its descriptor still: that one's close decides",
						(unsigned long long)ino, f->killed);
			continue;
		}
		if (a == WFS_CLOSE_ASK_FITS) {
			f->fits = wfs_seal_fits(fs, h->inode->ino, wfs_version_size(v), NULL, NULL, 0, true,
						"seal refused") == 0;
			f->fits_known = true;
			continue;
		}
		if (f->at_release) {
			/* A RELEASE carries no thread of its own most often: ask about the thread that
			 * wrote last, under fs->lock (writes after the last close are rare). */
			f->killed = wfs_writer_killed_by(proc_tid);
		} else {
			/* Without fs->lock: other inodes' requests do not wait for /proc. The handle stays
			 * (its RELEASE follows); another flush of it (a dup closed by another thread) may
			 * have ended its writing meanwhile, and the other facts may have changed. */
			bool ends = f->ends;
			int killed;

			wfs_unlock(&fs->lock);
			killed = ends ? wfs_writer_killed_by(proc_tid)
				      : wfs_writer_killed_before_data(v, h->opener_tid, proc_tid);
			wfs_lock(&fs->lock);
			if (h->writing != v) {
				wfs_version_put(v);
				return 0;
			}
			*f = facts_of(h, false);
			f->ends = ends;
			f->killed = killed;
		}
		f->killed_known = true;
	}
	ret = act(fs, h, v, f, a, news);
	wfs_version_put(v);
	return ret;
}

int wfs_closing_flush(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, struct wfs_news *news)
{
	struct wfs_close_facts f;

	if (!h->writing)
		return 0;
	f = facts_of(h, false);
	f.ends = wfs_writer_flush_ends(h->writing, h->writer_tid, tid);
	return decide_and_act(fs, h, &f, tid, news);
}

int wfs_closing_release(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, struct wfs_news *news)
{
	struct wfs_close_facts f;

	if (!h->writing)
		return 0;
	f = facts_of(h, true);
	return decide_and_act(fs, h, &f, tid ? tid : h->writer_tid, news);
}
