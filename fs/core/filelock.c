/* SPDX-License-Identifier: Apache-2.0 */
/*
 * filelock — the daemon's flock and POSIX locks, per lock identity (filelock.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>

#include "filelock.h"

/* One lock held. */
struct lock {
	struct wfs_filelock_req l;
	struct lock *next;
};

struct wfs_filelock_file {
	uint64_t id;
	struct lock *locks;
	struct wfs_filelock_wait *waiters, **waiters_tail; /* FIFO */
	bool posix_seen;            /* a POSIX lock was asked on it: opens send FLUSH (filelock.h) */
	struct wfs_filelock_file *next;
};

struct wfs_filelock_alias {
	uint64_t ino, id;
	struct wfs_filelock_alias *next;
};

static unsigned bucket(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (unsigned)(x % WFS_FILELOCK_BUCKETS);
}

int wfs_filelocks_init(struct wfs_filelocks *t)
{
	*t = (struct wfs_filelocks){0};
	return -pthread_mutex_init(&t->mu, NULL);
}

void wfs_filelocks_release(struct wfs_filelocks *t, struct wfs_filelock_wait **left)
{
	*left = NULL;
	for (unsigned b = 0; b < WFS_FILELOCK_BUCKETS; b++) {
		struct wfs_filelock_file *f, *fn;
		struct wfs_filelock_alias *a, *an;

		for (f = t->files[b]; f; f = fn) {
			struct lock *l, *ln;
			struct wfs_filelock_wait *w, *wn;

			fn = f->next;
			for (l = f->locks; l; l = ln) {
				ln = l->next;
				free(l);
			}
			for (w = f->waiters; w; w = wn) {
				wn = w->next;
				w->state = 2;
				w->next = *left;
				*left = w;
			}
			free(f);
		}
		for (a = t->aliases[b]; a; a = an) {
			an = a->next;
			free(a);
		}
		t->files[b] = NULL;
		t->aliases[b] = NULL;
	}
	t->nwaiting = 0;
	pthread_mutex_destroy(&t->mu);
}

/* (mu) */
static uint64_t identity(struct wfs_filelocks *t, uint64_t ino)
{
	for (struct wfs_filelock_alias *a = t->aliases[bucket(ino)]; a; a = a->next)
		if (a->ino == ino)
			return a->id;
	return ino;
}

uint64_t wfs_filelock_identity(struct wfs_filelocks *t, uint64_t ino)
{
	uint64_t id;

	pthread_mutex_lock(&t->mu);
	id = identity(t, ino);
	pthread_mutex_unlock(&t->mu);
	return id;
}

int wfs_filelock_moved(struct wfs_filelocks *t, uint64_t from, uint64_t to)
{
	struct wfs_filelock_alias *a;
	uint64_t id;

	if (from == to)
		return 0;
	pthread_mutex_lock(&t->mu);
	id = identity(t, from); /* a chain resolves to its first inode */
	for (a = t->aliases[bucket(to)]; a; a = a->next)
		if (a->ino == to)
			break;
	if (!a) {
		a = malloc(sizeof(*a));
		if (!a) {
			pthread_mutex_unlock(&t->mu);
			return -ENOMEM;
		}
		a->ino = to;
		a->next = t->aliases[bucket(to)];
		t->aliases[bucket(to)] = a;
	}
	a->id = id;
	pthread_mutex_unlock(&t->mu);
	return 0;
}

/* (mu) The file of identity @id, created when @create; NULL when absent (or no memory). */
static struct wfs_filelock_file *file_of(struct wfs_filelocks *t, uint64_t id, bool create)
{
	struct wfs_filelock_file *f;

	for (f = t->files[bucket(id)]; f; f = f->next)
		if (f->id == id)
			return f;
	if (!create)
		return NULL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	f->id = id;
	f->waiters_tail = &f->waiters;
	f->next = t->files[bucket(id)];
	t->files[bucket(id)] = f;
	return f;
}

/* (mu) Free @f when it holds nothing worth keeping. */
static void file_maybe_free(struct wfs_filelocks *t, struct wfs_filelock_file *f)
{
	struct wfs_filelock_file **p;

	if (f->locks || f->waiters || f->posix_seen)
		return;
	for (p = &t->files[bucket(f->id)]; *p != f; p = &(*p)->next)
		;
	*p = f->next;
	free(f);
}

static bool overlap(const struct wfs_filelock_req *a, const struct wfs_filelock_req *b)
{
	return a->start <= b->end && b->start <= a->end;
}

/* Does held lock @h keep request @rq (F_RDLCK or F_WRLCK) out? */
static bool conflicts(const struct wfs_filelock_req *h, const struct wfs_filelock_req *rq)
{
	if (h->flock != rq->flock || h->owner == rq->owner)
		return false;
	if (h->type != F_WRLCK && rq->type != F_WRLCK)
		return false;
	return rq->flock || overlap(h, rq);
}

/* (mu) The first lock of @f that keeps @rq out, or NULL. */
static struct lock *conflict_of(struct wfs_filelock_file *f, const struct wfs_filelock_req *rq)
{
	if (rq->type == F_UNLCK)
		return NULL;
	for (struct lock *l = f->locks; l; l = l->next)
		if (conflicts(&l->l, rq))
			return l;
	return NULL;
}

/* (mu) Drop @owner's flock lock on @f; true if there was one. */
static bool flock_drop(struct wfs_filelock_file *f, uint64_t owner)
{
	for (struct lock **p = &f->locks; *p; p = &(*p)->next)
		if ((*p)->l.flock && (*p)->l.owner == owner) {
			struct lock *l = *p;

			*p = l->next;
			free(l);
			return true;
		}
	return false;
}

/* (mu) Give @rq (no conflict) to @f: flock replaces the owner's lock, POSIX replaces the owner's
 * locks on the range (split, then merged with its neighbours of the same type). 0 or -ENOMEM, with
 * nothing changed. */
static int apply(struct wfs_filelock_file *f, const struct wfs_filelock_req *rq)
{
	struct lock *fresh = NULL, *split = NULL, **p;

	if (rq->type != F_UNLCK) {
		fresh = malloc(sizeof(*fresh));
		if (!fresh)
			return -ENOMEM;
		fresh->l = *rq;
	}
	if (rq->flock) {
		flock_drop(f, rq->owner);
		if (fresh) {
			fresh->next = f->locks;
			f->locks = fresh;
		}
		return 0;
	}
	/* The owner's own locks never overlap each other, so at most one holds the range strictly. */
	for (struct lock *l = f->locks; l; l = l->next)
		if (!l->l.flock && l->l.owner == rq->owner && l->l.start < rq->start && l->l.end > rq->end) {
			split = malloc(sizeof(*split));
			if (!split) {
				free(fresh);
				return -ENOMEM;
			}
			split->l = l->l;
			split->l.start = rq->end + 1;
			l->l.end = rq->start - 1;
			split->next = l->next;
			l->next = split;
			break;
		}
	for (p = &f->locks; *p;) {
		struct lock *l = *p;

		if (l->l.flock || l->l.owner != rq->owner || !overlap(&l->l, rq)) {
			p = &l->next;
			continue;
		}
		if (l->l.start < rq->start) {
			l->l.end = rq->start - 1;
		} else if (l->l.end > rq->end) {
			l->l.start = rq->end + 1;
		} else {
			*p = l->next;
			free(l);
			continue;
		}
		p = &l->next;
	}
	if (!fresh)
		return 0;
	/* Merge with the owner's touching locks of the same type (ext4 reports the merged range). */
	for (p = &f->locks; *p;) {
		struct lock *l = *p;
		bool before, after;

		if (l->l.flock || l->l.owner != rq->owner || l->l.type != rq->type) {
			p = &l->next;
			continue;
		}
		before = l->l.end != WFS_FILELOCK_EOF && l->l.end + 1 == fresh->l.start;
		after = fresh->l.end != WFS_FILELOCK_EOF && fresh->l.end + 1 == l->l.start;
		if (!before && !after) {
			p = &l->next;
			continue;
		}
		if (before)
			fresh->l.start = l->l.start;
		else
			fresh->l.end = l->l.end;
		*p = l->next;
		free(l);
	}
	fresh->next = f->locks;
	f->locks = fresh;
	return 0;
}

/* (mu) Grant, in order, every queued request of @f that nothing held keeps out now. */
static void wake(struct wfs_filelocks *t, struct wfs_filelock_file *f, struct wfs_filelock_wait **granted)
{
	struct wfs_filelock_wait **p = &f->waiters, *w;

	while ((w = *p)) {
		if (conflict_of(f, &w->rq) || apply(f, &w->rq) != 0) {
			p = &w->next;
			continue;
		}
		*p = w->next;
		if (!*p)
			f->waiters_tail = p;
		w->state = 2;
		w->next = NULL;
		t->nwaiting--;
		t->granted_waits++;
		while (*granted)
			granted = &(*granted)->next;
		*granted = w;
	}
}

static int check(const struct wfs_filelock_req *rq)
{
	if (rq->type != F_RDLCK && rq->type != F_WRLCK && rq->type != F_UNLCK)
		return -EINVAL;
	if (!rq->flock && (rq->start < 0 || rq->end < rq->start))
		return -EINVAL;
	return 0;
}

int wfs_filelock_test(struct wfs_filelocks *t, uint64_t ino, const struct wfs_filelock_req *rq,
		      struct wfs_filelock_req *held)
{
	struct wfs_filelock_file *f;
	struct lock *l = NULL;

	if (check(rq) || rq->type == F_UNLCK)
		return -EINVAL;
	pthread_mutex_lock(&t->mu);
	f = file_of(t, identity(t, ino), false);
	if (f)
		l = conflict_of(f, rq);
	if (l)
		*held = l->l;
	pthread_mutex_unlock(&t->mu);
	return l ? 1 : 0;
}

int wfs_filelock_set(struct wfs_filelocks *t, uint64_t ino, const struct wfs_filelock_req *rq,
		     struct wfs_filelock_wait *w, struct wfs_filelock_wait **granted)
{
	struct wfs_filelock_file *f;
	bool dropped = false;
	int ret = check(rq);

	if (ret)
		return ret;
	pthread_mutex_lock(&t->mu);
	f = file_of(t, identity(t, ino), rq->type != F_UNLCK || !rq->flock);
	if (!f) {
		pthread_mutex_unlock(&t->mu);
		return rq->type == F_UNLCK ? 0 : -ENOMEM;
	}
	if (!rq->flock)
		f->posix_seen = true;
	if (rq->flock) { /* a conversion drops the old lock first, as Linux's flock does */
		for (struct lock *l = f->locks; l; l = l->next)
			if (l->l.flock && l->l.owner == rq->owner && l->l.type == rq->type)
				goto out; /* held already */
		dropped = flock_drop(f, rq->owner);
	}
	if (conflict_of(f, rq)) {
		t->conflicts++;
		if (!w) {
			ret = -EAGAIN;
		} else if (w->interrupted) {
			ret = -EINTR;
		} else if (t->nwaiting >= WFS_FILELOCK_WAITERS_MAX) {
			ret = -ENOLCK;
		} else {
			w->state = 1;
			w->id = f->id;
			w->next = NULL;
			*f->waiters_tail = w;
			f->waiters_tail = &w->next;
			t->nwaiting++;
			ret = WFS_FILELOCK_QUEUED;
		}
		if (dropped)
			wake(t, f, granted);
		goto out;
	}
	ret = apply(f, rq);
	if (ret == 0 || dropped)
		wake(t, f, granted);
out:
	file_maybe_free(t, f);
	pthread_mutex_unlock(&t->mu);
	return ret;
}

bool wfs_filelock_cancel(struct wfs_filelocks *t, struct wfs_filelock_wait *w)
{
	struct wfs_filelock_file *f;
	bool out = false;

	pthread_mutex_lock(&t->mu);
	if (w->state == 0) {
		w->interrupted = true;
	} else if (w->state == 1 && (f = file_of(t, w->id, false))) {
		for (struct wfs_filelock_wait **p = &f->waiters; *p; p = &(*p)->next)
			if (*p == w) {
				*p = w->next;
				if (!*p)
					f->waiters_tail = p;
				break;
			}
		w->state = 2;
		w->next = NULL;
		t->nwaiting--;
		out = true;
		file_maybe_free(t, f);
	}
	pthread_mutex_unlock(&t->mu);
	return out;
}

/* (mu) Drop the locks of @f that @match says, then grant what that unblocked. */
static void drop_where(struct wfs_filelocks *t, uint64_t ino, bool (*match)(const struct lock *, uint64_t, bool),
		       uint64_t key, bool flock, struct wfs_filelock_wait **granted)
{
	struct wfs_filelock_file *f;
	bool dropped = false;

	pthread_mutex_lock(&t->mu);
	f = file_of(t, identity(t, ino), false);
	if (!f) {
		pthread_mutex_unlock(&t->mu);
		return;
	}
	for (struct lock **p = &f->locks; *p;) {
		struct lock *l = *p;

		if (match(l, key, flock)) {
			*p = l->next;
			free(l);
			dropped = true;
		} else {
			p = &l->next;
		}
	}
	if (dropped)
		wake(t, f, granted);
	file_maybe_free(t, f);
	pthread_mutex_unlock(&t->mu);
}

static bool owner_matches(const struct lock *l, uint64_t owner, bool flock)
{
	return l->l.owner == owner && l->l.flock == flock;
}

static bool handle_matches(const struct lock *l, uint64_t fh, bool flock)
{
	(void)flock;
	return l->l.fh == fh;
}

void wfs_filelock_drop_owner(struct wfs_filelocks *t, uint64_t ino, uint64_t owner, bool flock,
			     struct wfs_filelock_wait **granted)
{
	drop_where(t, ino, owner_matches, owner, flock, granted);
}

void wfs_filelock_drop_handle(struct wfs_filelocks *t, uint64_t ino, uint64_t fh,
			      struct wfs_filelock_wait **granted)
{
	drop_where(t, ino, handle_matches, fh, false, granted);
}

bool wfs_filelock_flush_wanted(struct wfs_filelocks *t, uint64_t ino)
{
	struct wfs_filelock_file *f;
	bool wanted;

	pthread_mutex_lock(&t->mu);
	f = file_of(t, identity(t, ino), false);
	wanted = f && f->posix_seen;
	pthread_mutex_unlock(&t->mu);
	return wanted;
}
