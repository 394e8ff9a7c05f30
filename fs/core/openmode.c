/* SPDX-License-Identifier: Apache-2.0 */
/* openmode.h: how the kernel serves each open (passthrough or daemon-served), and open handles. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "check.h"
#include "closing.h"
#include "daemon.h"
#include "fault.h"
#include "inode.h"
#include "log.h"
#include "mapped.h"
#include "object.h"
#include "openmode.h"
#include "seal.h"
#include "keep.h"
#include "version.h"
#include "weightfs.h"

static atomic_bool warned_txtbsy, warned_unsealed;

/* A handle for an open of @in, on fs->handles until handle_free(). */
static struct wfs_handle *handle_new(struct wfs_fs *fs, struct wfs_inode *in, bool writable)
{
	struct wfs_handle *h = fs->handle_recycled;

	if (h) { /* test-only, handle_free() */
		fs->handle_recycled = NULL;
		memset(h, 0, sizeof(*h));
	} else {
		h = calloc(1, sizeof(*h));
	}
	if (h) {
		h->inode = in;
		h->writable = writable;
		h->next = fs->handles;
		if (fs->handles)
			fs->handles->prev = h;
		fs->handles = h;
	}
	return h;
}

static void handle_free(struct wfs_fs *fs, struct wfs_handle *h)
{
	if (!h)
		return;
	if (h->prev)
		h->prev->next = h->next;
	else
		fs->handles = h->next;
	if (h->next)
		h->next->prev = h->prev;
	/* Test-only, WFS_FAULT=handle.recycle=EIO:0 (any errno): the next handle made gets this one's
	 * address, hence its fh, as malloc may hand it out (tests/takeover/run-handles' "reused" case
	 * needs that on any allocator and any number of CPUs). */
	if (wfs_fault("handle.recycle")) {
		free(fs->handle_recycled);
		fs->handle_recycled = h;
		return;
	}
	free(h);
}

void wfs_openmode_release_closed(struct wfs_fs *fs)
{
	struct wfs_handle *h = fs->handles, *next;
	unsigned n = 0;

	for (; h; h = next) {
		struct wfs_news news = {0}; /* no kernel to tell any more */

		next = h->next;
		if (!h->closed)
			continue;
		wfs_openmode_release(fs, h, 0, &news);
		n++;
	}
	if (n)
		wfs_log(WFS_LOG_INFO, "%u closed files whose release the kernel did not send before the "
			"unmount: released now", n);
}

void wfs_handles_release(struct wfs_fs *fs)
{
	while (fs->handles) {
		struct wfs_handle *h = fs->handles;

		fs->handles = h->next;
		if (h->writing)
			wfs_version_put(h->writing);
		free(h);
	}
	free(fs->handle_recycled);
	fs->handle_recycled = NULL;
}

/*
 * close(2) returns before the kernel's RELEASE reaches us, so a handle that was just closed may still
 * count in @count (io.npassthrough or io.ncached). Give pending releases up to @ms milliseconds
 * before deciding how to open. Drops fs->lock while waiting; the inode stays (the kernel holds a
 * lookup on it).
 */
static void wait_released(struct wfs_fs *fs, const unsigned *count, long ms)
{
	struct timespec deadline;

	if (*count == 0)
		return;
	deadline = wfs_deadline_in(ms);
	while (*count > 0)
		if (wfs_lock_timedwait(&fs->released, &fs->lock, &deadline) == ETIMEDOUT)
			break;
}

int wfs_openmode_wait_readers(struct wfs_fs *fs, struct wfs_inode *in)
{
	wait_released(fs, &in->io.npassthrough, 500);
	if (in->io.npassthrough == 0)
		return 0;
	wfs_log_once(&warned_txtbsy, WFS_LOG_WARN,
		     "inode %llu (find MNT -inum %llu): changed while open read-only through passthrough: "
		     "ETXTBSY (write a new name and rename it over this one instead; logged once)",
		     (unsigned long long)in->ino, (unsigned long long)in->ino);
	return -ETXTBSY;
}

int wfs_openmode_release_lent(struct wfs_fs *fs, struct wfs_handle *h)
{
	struct wfs_inode *in = h->inode;
	struct wfs_iomode *io = &in->io;

	if (h->writing || h->writable || !h->passthrough || io->pt_version || io->pt_inherited ||
	    (in->nlookup == 0 && io->nopen == 1))
		return -EAGAIN;
	wfs_openmode_release(fs, h, 0, NULL);
	return 0;
}

bool wfs_openmode_writers_closed(const struct wfs_inode *in)
{
	return in->io.nwritable > 0 && in->io.nwritable == in->io.nwritable_closed;
}

bool wfs_openmode_on_version(const struct wfs_inode *in)
{
	return in->io.npassthrough > 0 && in->io.pt_version && in->io.pt_version == in->writer;
}

/*
 * The writer's retry after a move must not be moved again, or it gets ESTALE (the VFS retries once):
 * a reader may open the new inode between the retry's LOOKUP and its OPEN. So the new inode is noted
 * for a second with the thread whose retry is on its way (the VFS retries in the same call). Until
 * that retry comes, writable opens of the inode go ahead in place (moved_take): the retry, and any
 * other writer, which would otherwise move the name again and leave the retry a second ESTALE. The
 * retry takes its own pass; another writer takes none (when the first writer beside the readers
 * took the pass, the next one moved the name from under a retry still on its way: ESTALE from
 * open(2)). A reader that comes in that time is daemon-served, which a writer may join, instead of
 * taking a passthrough backing file that would refuse it.
 */
static bool before(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

static struct wfs_moved *moved_find(struct wfs_fs *fs, uint64_t ino);

/* Thread @tid's retry (0: a thread not known) to let in place on inode @ino, for a second from now. */
static void moved_note(struct wfs_fs *fs, uint64_t ino, pid_t tid)
{
	struct wfs_moved *slot = moved_find(fs, ino);
	struct timespec now;
	size_t i;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if (!slot) {
		slot = &fs->moved.slot[0];
		for (i = 0; i < sizeof(fs->moved.slot) / sizeof(fs->moved.slot[0]); i++)
			if (before(&fs->moved.slot[i].until, &slot->until))
				slot = &fs->moved.slot[i]; /* the oldest (or an empty one) */
		*slot = (struct wfs_moved){.ino = ino};
	}
	for (i = 0; tid && i < sizeof(slot->retrying) / sizeof(slot->retrying[0]); i++)
		if (slot->retrying[i] == 0 || slot->retrying[i] == tid)
			break;
	if (tid && i < sizeof(slot->retrying) / sizeof(slot->retrying[0]))
		slot->retrying[i] = tid;
	else
		slot->passes++;
	slot->until = now;
	slot->until.tv_sec += 1;
}

static struct wfs_moved *moved_find(struct wfs_fs *fs, uint64_t ino)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	for (size_t i = 0; i < sizeof(fs->moved.slot) / sizeof(fs->moved.slot[0]); i++) {
		struct wfs_moved *m = &fs->moved.slot[i];

		if (m->ino == ino && before(&now, &m->until))
			return m;
	}
	return NULL;
}

/* May a writable open of @ino by thread @tid go ahead in place (a retry on its way)? Takes @tid's
 * pass, or one of the threads not known when @tid has none of its own (and there is one). */
static bool moved_take(struct wfs_fs *fs, uint64_t ino, pid_t tid)
{
	struct wfs_moved *m = moved_find(fs, ino);
	bool named = false, took = false;
	size_t i;

	if (!m)
		return false;
	for (i = 0; i < sizeof(m->retrying) / sizeof(m->retrying[0]); i++) {
		if (tid && m->retrying[i] == tid) {
			m->retrying[i] = 0;
			took = true;
		}
		named = named || m->retrying[i] != 0;
	}
	if (!took && !named && m->passes > 0)
		m->passes--;
	if (m->passes == 0 && !named)
		*m = (struct wfs_moved){0}; /* every retry on its way came */
	return true;
}

int wfs_openmode_stale_writer(struct wfs_fs *fs, struct wfs_inode *in, pid_t tid)
{
	uint64_t ino = in->io.moved_to;
	struct wfs_inode *next;

	/* Follow the name through later moves (a few at most: each needs readers and a second). */
	for (int hops = 0; hops < 8 && (next = wfs_inode_find(fs, ino)) != NULL && next->io.replaced; hops++)
		ino = next->io.moved_to;
	if (ino)
		moved_note(fs, ino, tid);
	return -ESTALE;
}

/* Does a WRITE of @len bytes fill a whole request (wfs_openmode_write_begin())? */
static bool whole_request(size_t len)
{
	return len + (size_t)sysconf(_SC_PAGESIZE) > WFS_WRITE_MAX;
}

static void write_going_on(struct wfs_fs *fs, struct wfs_handle *h, bool going_on)
{
	if (h->write_going_on == going_on)
		return;
	h->write_going_on = going_on;
	if (going_on)
		h->inode->io.nwrite_going_on++;
	else if (--h->inode->io.nwrite_going_on == 0)
		pthread_cond_broadcast(&fs->released); /* an O_TRUNC open may be waiting */
}

bool wfs_openmode_write_begin(struct wfs_fs *fs, struct wfs_handle *h, size_t len)
{
	if (!whole_request(len) && !h->write_going_on)
		return false;
	write_going_on(fs, h, true);
	h->inode->io.nsplit_in_flight++;
	return true;
}

void wfs_openmode_write_end(struct wfs_fs *fs, struct wfs_handle *h, size_t len, bool counted)
{
	struct wfs_iomode *io;

	if (!counted)
		return; /* @h unread: the kernel's order (this WRITE's reply, then @h's RELEASE, which
			 * frees it) is not one ThreadSanitizer sees */
	wfs_lock(&fs->lock);
	io = &h->inode->io;
	assert(io->nsplit_in_flight > 0);
	io->nsplit_in_flight--;
	io->split_wait_until = wfs_deadline_in(200);
	write_going_on(fs, h, whole_request(len));
	pthread_cond_broadcast(&fs->released);
	wfs_unlock(&fs->lock);
}

/* Before an O_TRUNC open truncates @in's version: let other handles' write(2)s end (see
 * wfs_openmode_write_begin()). Drops fs->lock while it waits. */
static void wait_split_writes(struct wfs_fs *fs, struct wfs_inode *in)
{
	struct wfs_iomode *io = &in->io;
	struct timespec now, until;

	while (io->nwrite_going_on > 0) {
		if (io->nsplit_in_flight > 0) {
			until = wfs_deadline_in(1000); /* a request in the daemon: it ends */
		} else {
			clock_gettime(CLOCK_REALTIME, &now);
			until = io->split_wait_until;
			if (!before(&now, &until))
				return; /* its write(2) ended on a whole request, or its writer is slow */
		}
		wfs_lock_timedwait(&fs->released, &fs->lock, &until);
	}
}

/* Would a writable open of @in (@nlink names) move its names away from its readers? */
static bool must_move(const struct wfs_inode *in, uint32_t nlink)
{
	return in->sealed && !in->writer && in->io.nwritable == 0 && in->io.nopen > 0 && nlink > 0;
}

/* Move @in's names to a new inode (*@fresh), noted for thread @tid's retry. Returns 0 (moved), 1
 * (no name left to move) or -errno of the catalog. */
static int move_names(struct wfs_fs *fs, struct wfs_inode *in, pid_t tid, struct wfs_news *news,
		      struct wfs_attr *fresh)
{
	int ret = wfs_catalog_inode_replace(fs->catalog, in->ino, wfs_news_name, news, fresh);

	if (ret)
		return ret == -ENOENT ? 1 : ret;
	in->io.replaced = true;
	in->io.moved_to = fresh->ino;
	/* Locks follow the name: the new inode shares the old one's lock identity (filelock.h). */
	if (wfs_filelock_moved(&fs->filelocks, in->ino, fresh->ino) != 0)
		wfs_log(WFS_LOG_WARN, "inode %llu: moved to %llu with its locks left behind: no memory",
			(unsigned long long)in->ino, (unsigned long long)fresh->ino);
	news->ino = in->ino;
	news->moved = true;
	moved_note(fs, fresh->ino, tid);
	fs->counters->moved_from_readers++;
	wfs_log(WFS_LOG_DEBUG, "inode %llu: opened for writing while %u readers hold it: name moved to inode "
		"%llu", (unsigned long long)in->ino, in->io.nopen, (unsigned long long)fresh->ino);
	return 0;
}

int wfs_openmode_move(struct wfs_fs *fs, struct wfs_inode *in, uint32_t nlink, pid_t tid, struct wfs_news *news)
{
	struct wfs_attr fresh;
	int ret;

	if (moved_take(fs, in->ino, tid))
		return 0; /* the writer's retry: readers that came first are daemon-served, join them */
	if (nlink == 0 && in->io.nopen > in->io.nwritable && !wfs_openmode_on_version(in)) {
		/* No name reaches it, yet the kernel reached it through a name, beside its readers: one a
		 * dead server moved away without living to tell the kernel (which resends the open to
		 * its successor), or one unlinked since the lookup. Joined, this writer would refuse
		 * passthrough readers (ETXTBSY) or truncate the bytes of daemon-served ones under their
		 * mappings (tests/takeover/run-readers: a kill between a move and its news). The VFS
		 * looks the name up again; a retry that reaches this inode again (a reopen through
		 * /proc/PID/fd) takes the pass noted here and waits for the readers, or joins them. */
		moved_note(fs, in->ino, tid);
		return 1;
	}
	if (!must_move(in, nlink))
		return 0; /* nlink 0: open but unlinked, no name to move */
	ret = move_names(fs, in, tid, news, &fresh);
	return ret == 0 ? 1 : ret == 1 ? 0 : ret;
}

int wfs_openmode_lookup(struct wfs_fs *fs, struct wfs_attr *a, pid_t tid, struct wfs_news *news)
{
	struct wfs_moved *m = NULL;
	struct wfs_inode *in;
	struct wfs_attr fresh;
	struct timespec now;
	bool clocked = false;
	size_t i = 0, k;
	int ret;

	if (!tid || !S_ISREG(a->mode))
		return 0;
	/* Every LOOKUP passes here: the clock is read only once a slot names @tid. */
	for (k = 0; !m && k < sizeof(fs->moved.slot) / sizeof(fs->moved.slot[0]); k++)
		for (i = 0; i < sizeof(fs->moved.slot[k].retrying) / sizeof(fs->moved.slot[k].retrying[0]); i++) {
			if (fs->moved.slot[k].retrying[i] != tid)
				continue;
			if (!clocked) {
				clock_gettime(CLOCK_MONOTONIC, &now);
				clocked = true;
			}
			if (before(&now, &fs->moved.slot[k].until)) {
				m = &fs->moved.slot[k];
				break;
			}
		}
	if (!m || m->ino == a->ino)
		return 0; /* not a retry, or one that reaches the inode its name moved to */
	in = wfs_inode_find(fs, a->ino);
	if (in && in->io.replaced)
		return 0; /* not the name's inode any more: its open gets ESTALE as any writer's would */
	if (in && must_move(in, a->nlink)) {
		m->retrying[i] = 0; /* the pass goes to the new inode (before moved_note() reuses @m) */
		ret = move_names(fs, in, tid, news, &fresh);
		if (ret)
			m->retrying[i] = tid; /* not moved: @m is as it was */
		else
			*a = fresh;
		return ret == 1 ? 0 : ret;
	}
	/* Nobody has it open, or it is being written (the retry would join its writer): a reader that
	 * opens it before the retry's open comes is daemon-served, and the retry opens it in place
	 * (moved_take()). Without the note, a writer that closed and a reader that opened it meanwhile
	 * made the retry's open move it, and the VFS does not retry twice: ESTALE to open(2). (A reader
	 * that joins a passthrough writer's file keeps it: it reads that file's bytes, as the
	 * writer's other readers do.) */
	m->retrying[i] = 0;
	moved_note(fs, a->ino, tid);
	return 0;
}

/*
 * Serve read-only handle @h of @in through passthrough on its object (h->object, pinned): the
 * inode's one backing file, registered now if it has none. Returns 0, or -errno of the backing.
 */
static int passthrough_on(struct wfs_fs *fs, struct wfs_inode *in, struct wfs_handle *h,
			  struct wfs_open_reply *r)
{
	struct wfs_iomode *io = &in->io;
	int id = wfs_object_backing(fs, h->object);

	if (id <= 0)
		return id ? id : -EIO;
	h->passthrough = true;
	r->backing_id = id;
	r->keep_cache = false;
	io->pt_object = h->object;
	io->pt_backing = id;
	io->npassthrough++;
	return 0;
}

/*
 * open_read_only() under a light hold of a lent fs->lock (lock.h): only the common case, a sealed
 * inode whose object this run knows good, through passthrough; no catalog, no wait. -EAGAIN for
 * anything else (the caller takes the lock for the ordinary path).
 */
static int open_read_only_lent(struct wfs_fs *fs, struct wfs_inode *in, struct wfs_handle *h,
			       struct wfs_open_reply *r)
{
	struct wfs_iomode *io = &in->io;
	struct wfs_object *o;
	int ret;

	if (!in->sealed || in->writer || io->pt_inherited || !atomic_load(&fs->passthrough) || moved_find(fs, in->ino))
		return -EAGAIN;
	if (io->npassthrough > 0 && !io->pt_version) {
		o = io->pt_object; /* all passthrough opens of an inode share one backing file */
		wfs_object_repin(o);
	} else if (io->npassthrough == 0 && io->ncached == 0 && wfs_check_known_good(fs, &in->digest)) {
		o = wfs_object_pin(fs, &in->digest);
		if (!o)
			return -EAGAIN;
	} else {
		return -EAGAIN;
	}
	h->object = o;
	ret = passthrough_on(fs, in, h, r);
	if (ret) {
		h->object = NULL;
		wfs_object_unpin(fs, o); /* a last unpin waits for the lender (object.h) */
		return -EAGAIN;
	}
	return 0;
}

/* A read-only open of @in: passthrough when the rule allows, else daemon-served. */
static int open_read_only(struct wfs_fs *fs, struct wfs_inode *in, struct wfs_handle *h, pid_t tid,
			  struct wfs_open_reply *r)
{
	struct wfs_iomode *io = &in->io;
	struct wfs_object *o;
	int ret;

	/* The writer that just sealed this file may not be released yet: without the wait, a reader
	 * mapping a file right after writing it would be daemon-served for as long as it keeps it.
	 * Only closed handles are waited for: one still open (a long-lived O_RDWR opener) stays. The
	 * wait drops fs->lock: what follows decides on the inode as it is after it (a passthrough
	 * writer that opened meanwhile left npassthrough > 0 with no object: the open crashed). */
	if (atomic_load(&fs->passthrough) && !in->writer && io->npassthrough == 0 &&
	    io->ncached == io->ncached_closed)
		wait_released(fs, &io->ncached, 100);
	if (io->npassthrough > 0 && io->pt_version) {
		/* A tensor being (or just) written through passthrough: its version's file is the
		 * inode's one backing file, which every open shares until the last closes. */
		h->passthrough = true;
		r->backing_id = io->pt_backing;
		io->npassthrough++;
		return 0;
	}
	if (!in->sealed && !in->writer) {
		wfs_log_once(&warned_unsealed, WFS_LOG_WARN,
			     "inode %llu: never sealed (its writer failed or was killed): EIO",
			     (unsigned long long)in->ino);
		return -EIO;
	}
	if (io->npassthrough > 0 && io->pt_inherited) {
		/* A dead server's readers hold it on the file that server registered: the kernel takes
		 * no other backing file for it until they close (wfs_openmode_adopt_reader()). */
		h->passthrough = true;
		r->backing_id = io->pt_backing;
		io->npassthrough++;
		return 0;
	}
	if (io->npassthrough > 0) {
		/* All passthrough opens of an inode share one backing file (checked by the first). */
		o = io->pt_object;
		wfs_object_repin(o);
	} else if (!in->writer) {
		o = wfs_object_pin(fs, &in->digest);
		if (!o)
			return -ENOMEM;
		ret = wfs_check_object(fs, o, tid); /* may drop fs->lock */
		if (ret) {
			wfs_object_unpin(fs, o);
			return ret;
		}
		if (io->npassthrough > 0 || in->writer || !wfs_digest_equal(&in->digest, wfs_object_digest(o))) {
			wfs_object_unpin(fs, o); /* the inode changed meanwhile: decide again */
			return open_read_only(fs, in, h, tid, r);
		}
	} else {
		o = NULL; /* being written: daemon-served from the version */
	}
	h->object = o;
	if (o && (io->npassthrough > 0 || (atomic_load(&fs->passthrough) && !in->writer && io->ncached == 0 &&
					    !moved_find(fs, in->ino)))) {
		ret = passthrough_on(fs, in, h, r);
		if (ret == 0)
			return 0;
		if (io->npassthrough > 0) {
			h->object = NULL;
			wfs_object_unpin(fs, o);
			return ret;
		}
	}
	/* Daemon-served: the kernel page cache of this inode may be kept when it holds this content. */
	r->keep_cache = !in->writer && in->sealed && io->cache_valid &&
			wfs_digest_equal(&io->cache_digest, &in->digest);
	if (!in->writer && in->sealed) {
		io->cache_valid = true;
		io->cache_digest = in->digest;
	}
	/* Beside a writer, or a writer's retry on a just-moved name (moved_take), reads bypass the page
	 * cache: a version a writer truncates can be shorter than the size the kernel last heard of,
	 * and a cached read short of it leaves zero-filled pages no writer wrote (fuse_short_read
	 * keeps i_size when a write moved attr_version meanwhile). Direct I/O returns short instead,
	 * as a read racing a truncate does on ext4. Mappings still go through the page cache
	 * (FUSE_CAP_DIRECT_IO_ALLOW_MMAP). */
	r->direct_io = fs->direct_writes && (in->writer || moved_find(fs, in->ino));
	io->ncached++;
	return 0;
}

/* Count @h, a new handle of its inode, as open. */
static void count_open(struct wfs_fs *fs, struct wfs_handle *h)
{
	struct wfs_iomode *io = &h->inode->io;

	io->nopen++;
	io->nwritable += h->writable;
	if (h->passthrough && h->writable)
		fs->counters->opens_passthrough_write++;
	else if (h->passthrough)
		fs->counters->opens_passthrough++;
	else
		fs->counters->opens_daemon++;
}

/*
 * Room for an undeclared file written through the kernel (WFS_PASSTHROUGH_WRITE_ROOM available,
 * root's reserve left out, as in wfs_seal_store_full())? On a fuller store the daemon serves it: its
 * bytes can still dedup onto stored content without room for a copy, and it sees a write fail (the
 * kernel's ENOSPC reaches only the writer: seal.h).
 */
static bool store_has_room(struct wfs_fs *fs)
{
	struct statvfs sv;

	return wfs_store_statfs(fs->store, &sv) == 0 &&
	       (uint64_t)sv.f_bavail * sv.f_frsize >= WFS_PASSTHROUGH_WRITE_ROOM;
}

/*
 * A writable open (open(2) flags @flags) through passthrough (openmode.h): the first writable open of
 * a file that nothing else has open gets a version in a tmp file as its backing file when its dtype
 * and shape declare at least WFS_PASSTHROUGH_WRITE_MIN bytes (that space reserved), or, with
 * -o passthrough_writes=all, when it is opened with O_TRUNC and without O_DIRECT on a store with
 * WFS_PASSTHROUGH_WRITE_ROOM free; a writable open while such a version is being written joins it.
 * Returns 1 (set up: reply with r->backing_id), 0 (serve it from the daemon instead: passthrough
 * off, another open, no room), or -errno of starting the version.
 */
static int open_writer_passthrough(struct wfs_fs *fs, struct wfs_inode *in, struct wfs_handle *h,
				   int flags, pid_t tid, struct wfs_open_reply *r)
{
	bool truncate = flags & O_TRUNC;
	struct wfs_iomode *io = &in->io;
	struct wfs_version *v;
	uint64_t declared;
	int fd, id, ret;

	if (!atomic_load(&fs->passthrough) || !fs->opt.passthrough_writes)
		return 0;
	if (wfs_openmode_on_version(in)) {
		v = in->writer;
		if (wfs_version_frozen(v))
			return 0; /* being sealed: wait for it like any writer beside passthrough readers */
		if (truncate && wfs_version_truncate(v, 0))
			return 0;
		wfs_seal_join(h, v);
	} else {
		if (io->nopen > 0 || in->writer)
			return 0;
		if (wfs_seal_declared_size(fs, in->ino, &declared))
			declared = 0; /* nothing declared: nothing reserved */
		if (declared < WFS_PASSTHROUGH_WRITE_MIN &&
		    !(truncate && !(flags & O_DIRECT) && fs->opt.passthrough_writes == WFS_WRITES_ALL &&
		      store_has_room(fs)))
			return 0;
		v = wfs_seal_writer(fs, in, truncate, &ret); /* may drop fs->lock (a rewrite's copy) */
		if (!v)
			return ret;
		/* Reserving the space is disk work (ext4 waits for its journal under writeback): without
		 * fs->lock. @in stays: it has a writer. */
		wfs_unlock(&fs->lock);
		fd = wfs_version_kernel_backing(v, declared);
		wfs_delay("openmode.backing"); /* test-only: a seal begins before this writer joins */
		wfs_lock(&fs->lock);
		if (fd >= 0 && (io->nopen > 0 || in->writer != v))
			fd = -EBUSY; /* others opened it meanwhile: the daemon serves them all */
		/* Until the join below counts this writer, a truncate(2) or a writer's release may have
		 * begun to seal @v: its file, published as an object, must not become a writer's backing
		 * file (the kernel's writes would change a stored object). The daemon serves this open
		 * instead, on the next version. */
		if (fd >= 0 && wfs_version_frozen(v))
			fd = -EBUSY;
		if (fd >= 0 && !fs->kernel.backing_open)
			fd = -EOPNOTSUPP;
		id = fd >= 0 ? fs->kernel.backing_open(fs->kernel.ctx, fd) : fd; /* read-only: version.h */
		if (id <= 0) {
			wfs_version_put(v); /* the version stays for the daemon path to use */
			return 0;
		}
		wfs_seal_join(h, v);
		wfs_version_put(v);
		wfs_version_get(v); /* io->pt_version's reference */
		io->pt_version = v;
		io->pt_backing = id;
	}
	h->passthrough = true;
	h->writer_tid = tid;
	r->backing_id = io->pt_backing;
	io->npassthrough++;
	return 1;
}

/* Are @io's writable handles all closed with their writing ended, their releases to come? */
static bool ended_writers_only(const struct wfs_iomode *io)
{
	return io->nwritable_ended > 0 && io->nwritable_ended == io->nwritable;
}

/*
 * Before a writable open decides whether to move @in's names (wfs_openmode_move()): a handle closed
 * just before this open (the create's, or the last '>>' of a loop) may not be released yet, and
 * with it gone the open may be written through passthrough (open_writer_passthrough()), or move the
 * names away from readers. Give its release up to 100 ms (a writer's whose close ended its
 * writing: WFS_FINISHED_RELEASE_WAIT_MS), dropping fs->lock. Waited for before the decision, not
 * after: a writer that waited after it, not yet counted, let another writer's open move the names
 * away meanwhile, and went on in the old inode, which no name reaches: its write(2)s returned
 * success and were lost.
 */
static void wait_closed_release(struct wfs_fs *fs, struct wfs_inode *in)
{
	struct wfs_iomode *io = &in->io;
	struct timespec deadline;

	/* Every writable handle's close(2) ended its writing (a daemon-served writer's, which sealed
	 * the file): until their releases come they count as writers and keep the names here, so this
	 * open would truncate or write the file beside readers that opened it after those closes,
	 * which keep the old bytes beside any other rewrite (a mapping of them faulted with SIGBUS).
	 * Such a release is on its way, unless a process that inherited the descriptor still holds it
	 * (a writer still: joined, as before). Without readers there is nothing to wait for. */
	if (ended_writers_only(io) && io->nopen > io->nwritable) {
		deadline = wfs_deadline_in(WFS_FINISHED_RELEASE_WAIT_MS);
		while (ended_writers_only(io) &&
		       wfs_lock_timedwait(&fs->released, &fs->lock, &deadline) != ETIMEDOUT)
			;
	}
	if (!atomic_load(&fs->passthrough) || !fs->opt.passthrough_writes || wfs_openmode_on_version(in))
		return;
	if (io->nopen > 0 && io->npassthrough == 0 && io->ncached == io->ncached_closed)
		wait_released(fs, &io->ncached, 100);
}

/*
 * Written through passthrough, and finished: every writer has closed, the last close(2) said the
 * bytes are done (closing.h FINISH), and no close refused their size. Its version's file is the
 * inode's backing file until the last passthrough open closes (struct wfs_iomode). (Not the version
 * lock: the seal holds it while it hashes.)
 */
static bool passthrough_finished(struct wfs_inode *in)
{
	struct wfs_version *v = in->writer;

	return v && wfs_openmode_on_version(in) && wfs_openmode_writers_closed(in) && wfs_version_finished(v) &&
	       !wfs_version_refused(v);
}

/* wfs_openmode_open() of @in (pinned: it stays while the waits below drop fs->lock). */
static int open_pinned(struct wfs_fs *fs, struct wfs_inode *in, struct wfs_attr a, bool writable, int flags,
		       pid_t tid, struct wfs_handle **hp, struct wfs_open_reply *r, struct wfs_news *news)
{
	bool truncate = flags & O_TRUNC;
	uint64_t ino = in->ino;
	struct wfs_version *v;
	struct wfs_handle *h;
	int ret;

	if (!writable && passthrough_finished(in)) {
		/* The bytes of a file the kernel wrote, whose writer's close(2) said they are done: read
		 * from its version's file while the seal hashes and publishes them, without waiting. */
	} else if ((in->writer && wfs_openmode_writers_closed(in)) || fs->releases_telling) {
		/* The last writer closed and its seal is coming (its release; a passthrough tensor's
		 * hash), or its drop (a close that refused the size): wait for it, so that a reader opens
		 * what close(2) left (the sealed bytes, or the old ones after a refusal) and a writer
		 * finds the name sealed and moves it away from its readers, instead of waiting for
		 * passthrough readers that stay (ETXTBSY). A release that has just finished may still be
		 * telling the kernel (fs->releases_telling): waited for too, whichever inode it was. */
		wfs_openmode_wait_release(fs, ino);
		ret = wfs_catalog_getattr(fs->catalog, ino, &a); /* @in, pinned, is still the entry */
		if (ret)
			return ret;
		wfs_inode_attr_note(fs, &a);
	}
	if (writable)
		wait_closed_release(fs, in);
	/* A writer must reach the name's new inode: the kernel looks the name up again. A reader that
	 * looked the name up before it moved opens what it found, as an open racing a rename does. */
	if (in->io.replaced && writable)
		return wfs_openmode_stale_writer(fs, in, tid);
	if (writable) {
		ret = wfs_openmode_move(fs, in, a.nlink, tid, news);
		if (ret == 1)
			return -ESTALE; /* the VFS retries on the name's new inode */
		if (ret < 0)
			return ret;
		/* The names stay here for this writer from now on: it counts as one while what follows
		 * drops fs->lock (a version's copy or check, waits for readers), so that no other
		 * writer's open moves them away meanwhile, leaving this one writing an inode that no
		 * name reaches. count_open() counts it for good. */
		in->io.nwritable++;
	}
	h = handle_new(fs, in, writable);
	if (!h) {
		in->io.nwritable -= writable;
		return -ENOMEM;
	}
	h->opener_tid = writable ? tid : 0;
	h->append = writable && (flags & O_APPEND);
	ret = writable ? open_writer_passthrough(fs, in, h, flags, tid, r) : 0;
	if (ret < 0) {
		in->io.nwritable--;
		handle_free(fs, h);
		return ret;
	}
	if (ret == 1) {
		in->io.nwritable--; /* passthrough writer: count_open() below counts it */
	} else if (writable) {
		/* Daemon-served. Counted as open before the waits below drop fs->lock: an open that comes
		 * meanwhile must find it and be daemon-served too, not start a passthrough file beside it
		 * (the kernel fails an open whose mode differs from the inode's others with EIO). */
		in->io.nopen++;
		in->io.ncached++;
		ret = wfs_openmode_wait_readers(fs, in);
		if (ret == 0 && truncate) {
			wait_split_writes(fs, in);
			v = wfs_seal_writer(fs, in, true, &ret);
			if (v) {
				wfs_seal_join(h, v);
				wfs_version_put(v);
			}
		}
		in->io.nopen--; /* count_open() below counts them */
		in->io.nwritable--;
		if (ret) {
			if (--in->io.ncached == 0)
				pthread_cond_broadcast(&fs->released);
			handle_free(fs, h);
			return ret;
		}
		r->direct_io = fs->direct_writes;
	} else {
		ret = open_read_only(fs, in, h, tid, r);
		if (ret) {
			if (h->object)
				wfs_object_unpin(fs, h->object);
			handle_free(fs, h);
			wfs_inode_maybe_free(fs, in);
			return ret;
		}
	}
	r->noflush = !writable && h->passthrough;
	count_open(fs, h);
	*hp = h;
	return 0;
}

int wfs_openmode_open(struct wfs_fs *fs, uint64_t ino, bool writable, int flags, pid_t tid,
		      struct wfs_handle **hp, struct wfs_open_reply *r, struct wfs_news *news)
{
	struct wfs_inode *in;
	struct wfs_attr a;
	int ret;

	*r = (struct wfs_open_reply){0};
	ret = wfs_inode_get_file(fs, ino, false, &a, &in);
	if (ret)
		return ret;
	/* The waits below drop fs->lock, and a lookup need not keep @in meanwhile: after a takeover
	 * this server counts none of the kernel's lookups, so the release of another handle (an
	 * adopted writer's) would free it under this open. */
	wfs_inode_pin(in);
	ret = open_pinned(fs, in, a, writable, flags, tid, hp, r, news);
	wfs_inode_unpin(fs, in);
	return ret;
}

int wfs_openmode_open_lent(struct wfs_fs *fs, uint64_t ino, struct wfs_handle **hp, struct wfs_open_reply *r)
{
	struct wfs_inode *in = wfs_inode_find(fs, ino);
	struct wfs_handle *h;
	int ret;

	*r = (struct wfs_open_reply){0};
	if (!in)
		return -EAGAIN; /* not known in memory: the catalog says what it is */
	h = handle_new(fs, in, false);
	if (!h)
		return -EAGAIN;
	ret = open_read_only_lent(fs, in, h, r);
	if (ret) {
		handle_free(fs, h); /* @in's counts are as they were */
		return ret;
	}
	r->noflush = true;
	count_open(fs, h);
	fs->counters->opens_lent++;
	*hp = h;
	return 0;
}

int wfs_openmode_create(struct wfs_fs *fs, struct wfs_inode *in, int flags, pid_t tid,
			struct wfs_handle **hp, struct wfs_open_reply *r)
{
	struct wfs_handle *h = handle_new(fs, in, true);
	struct wfs_version *v;
	int ret = -ENOMEM;

	*r = (struct wfs_open_reply){0};
	if (h) {
		h->opener_tid = tid;
		h->append = flags & O_APPEND;
	}
	if (h && (flags & O_TRUNC)) {
		ret = open_writer_passthrough(fs, in, h, flags, tid, r);
		if (ret == 1) {
			count_open(fs, h);
			*hp = h;
			return 0;
		}
		if (ret < 0) {
			handle_free(fs, h);
			return ret;
		}
		ret = -ENOMEM;
	}
	v = h ? wfs_seal_writer(fs, in, true, &ret) : NULL;
	if (!v) {
		handle_free(fs, h);
		return ret;
	}
	wfs_seal_join(h, v); /* a created file is sealed at close even if nothing is written */
	wfs_version_put(v);
	in->io.ncached++;
	count_open(fs, h);
	r->direct_io = fs->direct_writes;
	*hp = h;
	return 0;
}

/*
 * Where a daemon-served read of @h reads from now: the version being written (referenced into *@v),
 * or the inode's current object (pinned in h->object; its descriptor into *@fd).
 */
static int read_source(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, struct wfs_version **v, int *fd)
{
	struct wfs_inode *in = h->inode;
	struct wfs_object *o;

	*v = NULL;
	if (in->writer) {
		wfs_version_get(in->writer);
		*v = in->writer;
		return 0;
	}
	if (!in->sealed)
		return -EIO;
	if (!h->object || !wfs_digest_equal(wfs_object_digest(h->object), &in->digest)) {
		int ret;

		o = wfs_object_pin(fs, &in->digest);
		if (!o)
			return -ENOMEM;
		ret = wfs_check_object(fs, o, tid); /* may drop fs->lock: the caller retries on -EAGAIN */
		if (ret == 0 && (in->writer || !wfs_digest_equal(&in->digest, wfs_object_digest(o))))
			ret = -EAGAIN;
		if (ret) {
			wfs_object_unpin(fs, o);
			return ret;
		}
		if (h->object)
			wfs_object_unpin(fs, h->object);
		h->object = o;
	}
	*fd = wfs_object_fd(fs, h->object);
	return *fd < 0 ? *fd : 0;
}

int wfs_openmode_read_object(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, int *fd)
{
	struct wfs_version *v;
	int ret;

	*fd = -1;
	wfs_lock(&fs->lock);
	do
		ret = read_source(fs, h, tid, &v, fd);
	while (ret == -EAGAIN);
	/* A descriptor of the caller's own: its reply ends the request, after which the handle's
	 * RELEASE may unpin the object and close the shared one while the caller still drops pages. */
	if (ret == 0 && !v && (*fd = fcntl(*fd, F_DUPFD_CLOEXEC, 0)) < 0)
		ret = -errno;
	wfs_unlock(&fs->lock);
	if (ret == 0 && v) {
		wfs_version_put(v);
		*fd = -1;
		return 1;
	}
	return ret;
}

/*
 * The largest folio the page cache makes: a PMD's span (MAX_PAGECACHE_ORDER; 2 MiB with 4 KiB
 * pages, where a page table page holds 512 eight-byte entries).
 */
static off_t largest_folio_bytes(void)
{
	long page = sysconf(_SC_PAGESIZE);

	return page > 0 ? (off_t)page * (page / 8) : (off_t)2 << 20;
}

/* How far behind a read its drop reaches: four times the default -o readahead (what is in flight). */
#define WFS_READ_DROP_BACK ((off_t)16 << 20)

void wfs_openmode_read_done(struct wfs_fs *fs, int fd, off_t off, size_t len)
{
	static _Atomic off_t block_bytes; /* request threads read it at once: set once, the same by all */
	off_t block, from, to, end = off + (off_t)len;
	struct stat st;

	if (atomic_load(&fs->passthrough))
		return; /* the object's page cache is the copy passthrough readers share */
	block = atomic_load_explicit(&block_bytes, memory_order_relaxed);
	if (!block) {
		block = largest_folio_bytes();
		atomic_store_explicit(&block_bytes, block, memory_order_relaxed);
	}
	/* DONTNEED drops only whole folios: a large folio partly inside the range stays cached
	 * (mm/truncate.c). So drop the blocks this read finished, and at the end of the file the
	 * rest; readahead beyond the read stays for the next one. The kernel's readahead sends
	 * several reads at once, which finish in any order: a read that finished a block before an
	 * earlier one read its part would leave that part cached, so the drop reaches back over the
	 * blocks such reads can still be in (WFS_READ_DROP_BACK). */
	from = off - off % block - WFS_READ_DROP_BACK;
	if (from < 0)
		from = 0;
	to = end - end % block;
	if (to != end && fstat(fd, &st) == 0 && end >= st.st_size)
		(void)posix_fadvise(fd, from, 0, POSIX_FADV_DONTNEED); /* through the end of the file */
	else if (to > from)
		(void)posix_fadvise(fd, from, to - from, POSIX_FADV_DONTNEED);
}

ssize_t wfs_openmode_read(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, void *buf, size_t len,
			  off_t off)
{
	struct wfs_version *v;
	ssize_t n;
	int fd = -1;

	for (;;) {
		wfs_lock(&fs->lock);
		do
			n = read_source(fs, h, tid, &v, &fd);
		while (n == -EAGAIN);
		wfs_unlock(&fs->lock);
		if (n)
			return n;
		if (!v)
			break;
		n = wfs_version_read(v, buf, len, off);
		if (n == -EAGAIN) {
			wfs_lock(&fs->lock);
			while (h->inode->writer == v)
				wfs_lock_wait(&fs->seal_done, &fs->lock);
			wfs_unlock(&fs->lock);
		}
		wfs_version_put(v);
		if (n != -EAGAIN)
			return n;
	}
	/* The descriptor stays valid: h->object is pinned by this handle until release. */
	n = pread(fd, buf, len, off);
	if (n < 0)
		return -errno;
	wfs_openmode_read_done(fs, fd, off, (size_t)n);
	return n;
}

struct wfs_adopted_writer wfs_openmode_closed_state(const struct wfs_handle *h)
{
	return (struct wfs_adopted_writer){
		.closed = h->closed,
		.finished = h->writing && wfs_version_finished(h->writing),
		.ended = h->ended,
	};
}

int wfs_openmode_flush(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, struct wfs_news *news)
{
	bool writing = h->writing != NULL;
	int ret;

	write_going_on(fs, h, false);
	if (!h->closed) {
		h->closed = true;
		h->inode->io.ncached_closed += !h->passthrough;
		h->inode->io.nwritable_closed += h->writable;
	}
	ret = wfs_closing_flush(fs, h, tid, news);
	if (writing && !h->writing && !h->ended) {
		h->ended = true; /* sealed, or left to the other writers (closing.h) */
		h->inode->io.nwritable_ended++;
	}
	return ret;
}

bool wfs_openmode_flush_seals_data(const struct wfs_handle *h)
{
	return h->writable && !h->passthrough;
}

bool wfs_openmode_release_seals_data(struct wfs_handle *h)
{
	return h->writing && (h->passthrough || wfs_version_size(h->writing) > 0);
}

void wfs_openmode_release(struct wfs_fs *fs, struct wfs_handle *h, pid_t tid, struct wfs_news *news)
{
	struct wfs_inode *in = h->inode;
	struct wfs_iomode *io = &in->io;
	int ret;

	/* Under a light hold of a lent fs->lock only a read-only passthrough handle on an object, whose
	 * inode stays (wfs_openmode_release_lent() checked): no seal, no catalog below. */
	assert(!wfs_lock_is_lent(&fs->lock) || (!h->writing && !h->writable && h->passthrough && !io->pt_version));

	/* Writes after the last flush (a shared mapping written back at munmap), and a passthrough
	 * writer's file, seal here; the kernel drops release errors, so they can only be logged. */
	write_going_on(fs, h, false);
	/* A release ends the handle's every close. An adopted one's flush went to a dead server
	 * (takeover.h): counted as closed now, so that an open beside the seal this release makes waits
	 * for it as after a flush, instead of joining a writer that is gone (open_pinned()). */
	if (!h->closed) {
		h->closed = true;
		io->ncached_closed += !h->passthrough;
		io->nwritable_closed += h->writable;
	}
	ret = wfs_closing_release(fs, h, tid, news);
	if (ret)
		WFS_LOG_LIMITED(WFS_LOG_ERR, "inode %llu: seal at release failed: %s", (unsigned long long)in->ino,
				strerror(-ret));
	if (h->passthrough) {
		assert(io->npassthrough > 0);
		if (--io->npassthrough == 0) {
			if ((io->pt_version || io->pt_inherited) && fs->kernel.backing_close)
				fs->kernel.backing_close(fs->kernel.ctx, io->pt_backing);
			if (io->pt_version)
				wfs_version_put(io->pt_version);
			io->pt_version = NULL;
			io->pt_inherited = false;
			io->pt_object = NULL;
			io->pt_backing = 0;
			pthread_cond_broadcast(&fs->released); /* a writable open may be waiting */
		}
	} else {
		assert(io->ncached > 0 && io->ncached_closed >= h->closed);
		io->ncached_closed -= h->closed;
		if (--io->ncached == 0)
			pthread_cond_broadcast(&fs->released); /* a read-only open may wait to go passthrough */
	}
	if (h->object)
		wfs_object_unpin(fs, h->object);
	assert(io->nopen > 0 && io->nwritable >= h->writable);
	assert(io->nwritable_closed >= (h->writable && h->closed) && io->nwritable_ended >= h->ended);
	io->nwritable_closed -= h->writable && h->closed;
	io->nwritable_ended -= h->ended;
	if (h->ended && io->nwritable_ended == 0)
		pthread_cond_broadcast(&fs->released); /* a writable open may be waiting */
	io->nwritable -= h->writable;
	io->nopen--;
	wfs_inode_maybe_free(fs, in);
	handle_free(fs, h);
}

void wfs_openmode_wait_release(struct wfs_fs *fs, uint64_t ino)
{
	struct wfs_inode *in = wfs_inode_find(fs, ino);
	/* A file the kernel wrote whose writer said it was done: readers that opened it since share
	 * its file (passthrough_finished()), and a writable open that stopped waiting would join that
	 * file and truncate or write it under them (a mapping of it faulted with SIGBUS), where a
	 * rewrite leaves its readers the old bytes. Its release comes once the kernel is done with the
	 * writer's file: later than 100 ms only on a loaded machine, or with the descriptor inherited
	 * by a process that still runs (which may still write: joined as a writer, as before). */
	struct timespec deadline =
		wfs_deadline_in(in && passthrough_finished(in) ? WFS_FINISHED_RELEASE_WAIT_MS : 100);
	bool long_wait = false;

	/*
	 * Up to 100 ms for the release to come (WFS_FINISHED_RELEASE_WAIT_MS above); a seal already
	 * running (FROZEN: a tensor written through passthrough is hashed at its release) is waited
	 * for to its end, up to a minute. A release that does not come (a writable mapping kept after
	 * close) is not waited for: the caller answers with what the name holds now.
	 */
	while (in && in->writer && wfs_openmode_writers_closed(in)) {
		if (wfs_version_frozen(in->writer) && !long_wait) {
			deadline = wfs_deadline_in(60 * 1000);
			long_wait = true;
		}
		if (wfs_lock_timedwait(&fs->seal_done, &fs->lock, &deadline) == ETIMEDOUT)
			return;
		in = wfs_inode_find(fs, ino);
	}
	/* Released, with a writable mapping that outlived its close: sealed when the mapping goes, which
	 * munmap(2) may have done just before this request. */
	if (in && in->writer)
		wfs_mapped_settle(fs, in);
	/* A release tells the kernel after it lets go of fs->lock (a dropped version's size, which the
	 * kernel took from the writes): an open answered before that, even one that found the release
	 * done, would read with the kernel's stale size. */
	while (fs->releases_telling)
		if (wfs_lock_timedwait(&fs->seal_done, &fs->lock, &deadline) == ETIMEDOUT)
			break;
}

int wfs_openmode_adopt_version(struct wfs_fs *fs, const struct wfs_keep_record *r)
{
	struct wfs_version *v;
	struct wfs_inode *in;
	struct wfs_attr a;
	int ret;

	ret = wfs_inode_get_file(fs, r->ino, true, &a, &in);
	if (ret)
		return ret;
	if (in->writer)
		return -EEXIST; /* two records for one inode: neither is sure to be the last */
	v = wfs_version_adopt(fs->store, r, &ret);
	if (!v) {
		wfs_inode_maybe_free(fs, in);
		return ret;
	}
	in->writer = v; /* the inode's reference */
	in->attr_told = true;
	in->io.cache_valid = false;
	return 0;
}

int wfs_openmode_adopt(struct wfs_fs *fs, uint64_t ino, const struct wfs_adopted_writer *w, struct wfs_handle **hp)
{
	bool passthrough = w->passthrough;
	struct wfs_inode *in;
	struct wfs_handle *h;
	struct wfs_iomode *io;
	struct wfs_attr a;
	int ret;

	ret = wfs_inode_get_file(fs, ino, true, &a, &in);
	if (ret)
		return ret;
	io = &in->io;
	if (!in->writer && !in->sealed)
		ret = -EIO; /* its bytes died with the server */
	else if (passthrough && !(in->writer && wfs_version_kernel_written(in->writer)))
		ret = -EIO; /* the kernel writes a file this server does not know */
	if (ret) {
		wfs_inode_maybe_free(fs, in);
		return ret;
	}
	h = handle_new(fs, in, true);
	if (!h)
		return -ENOMEM;
	h->append = w->append;
	if (passthrough) {
		if (io->npassthrough == 0) {
			/* The kernel has this file under the dead server's backing id: registering it
			 * again gives that id (wfs_takeover_backing_inherited(), in fs/ops.c). */
			int fd = wfs_version_kernel_backing(in->writer, 0);
			int id = fd >= 0 && fs->kernel.backing_open ? fs->kernel.backing_open(fs->kernel.ctx, fd) : -EIO;

			if (id <= 0) {
				handle_free(fs, h);
				wfs_inode_maybe_free(fs, in);
				return id < 0 ? id : -EIO;
			}
			io->pt_backing = id;
			io->pt_version = in->writer;
			wfs_version_get(in->writer);
		}
		io->npassthrough++;
		h->passthrough = true;
	} else {
		io->ncached++;
	}
	if (in->writer && !w->ended) {
		wfs_seal_join(h, in->writer); /* sealed at its close or release, as before the takeover */
		if (w->finished)
			wfs_version_finish(in->writer);
	}
	count_open(fs, h);
	if (w->closed) {
		h->closed = true;
		io->nwritable_closed++;
		io->ncached_closed += !h->passthrough;
	}
	if (w->ended) {
		h->ended = true;
		io->nwritable_ended++;
	}
	*hp = h;
	return 0;
}

int wfs_openmode_adopt_reader(struct wfs_fs *fs, uint64_t ino, int backing_id, struct wfs_handle **hp)
{
	struct wfs_inode *in;
	struct wfs_handle *h;
	struct wfs_iomode *io;
	struct wfs_attr a;
	bool first = false;
	int ret;

	ret = wfs_inode_get_file(fs, ino, true, &a, &in);
	if (ret)
		return ret;
	io = &in->io;
	/* The kernel keeps one mode per inode: a record that disagrees was left half-written. */
	if (backing_id > 0 ? io->ncached > 0 || (io->npassthrough > 0 && io->pt_backing != backing_id)
			   : io->npassthrough > 0) {
		wfs_inode_maybe_free(fs, in);
		return -EBUSY;
	}
	h = handle_new(fs, in, false);
	if (!h) {
		wfs_inode_maybe_free(fs, in);
		return -ENOMEM;
	}
	if (backing_id > 0) {
		if (io->npassthrough == 0) {
			io->pt_backing = backing_id;
			io->pt_inherited = true;
			first = true;
		} else if (io->pt_object) {
			h->object = io->pt_object;
			wfs_object_repin(h->object);
		}
		io->npassthrough++;
		h->passthrough = true;
	} else {
		io->ncached++; /* its reads pin the inode's object (read_source()) */
	}
	count_open(fs, h);
	*hp = h;
	return first;
}

void wfs_openmode_adopted_reply(const struct wfs_fs *fs, const struct wfs_handle *h, struct wfs_open_reply *r)
{
	*r = (struct wfs_open_reply){0};
	if (h->passthrough)
		r->backing_id = h->inode->io.pt_backing; /* the dead server's id: the kernel's for this file */
	else
		r->direct_io = fs->direct_writes;
}
