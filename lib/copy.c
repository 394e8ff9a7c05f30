/* SPDX-License-Identifier: Apache-2.0 */
/* copy.h: a byte range from one file to another, in order. */
#include "copy.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

static bool stopped(const struct wfs_copy *c)
{
	return c->stop && *c->stop;
}

int wfs_copy_range(struct wfs_copy *c, int in, uint64_t in_off, int out, uint64_t out_off, uint64_t bytes)
{
	while (bytes > 0) {
		size_t want = bytes < WFS_COPY_CHUNK ? (size_t)bytes : WFS_COPY_CHUNK;
		ssize_t n = -1;

		if (stopped(c))
			return -EINTR;
		if (!c->no_cfr) {
			loff_t i = (loff_t)in_off, o = (loff_t)out_off;

			n = copy_file_range(in, &i, out, &o, want, 0);
			if (n < 0 && errno != EINTR && errno != ENOSPC && errno != EDQUOT && errno != EIO)
				c->no_cfr = true; /* EXDEV, EOPNOTSUPP, EINVAL, ...: not for these files */
			else if (n < 0 && errno != EINTR)
				return -errno;
		}
		if (c->no_cfr) {
			ssize_t w, done = 0;

			if (!c->buf && !(c->buf = malloc(WFS_COPY_RW_CHUNK)))
				return -ENOMEM;
			n = pread(in, c->buf, want < WFS_COPY_RW_CHUNK ? want : WFS_COPY_RW_CHUNK, (off_t)in_off);
			if (n < 0 && errno != EINTR)
				return -errno;
			while (n > 0 && done < n) {
				w = pwrite(out, c->buf + done, (size_t)(n - done), (off_t)(out_off + (uint64_t)done));
				if (w < 0 && errno == EINTR) {
					if (stopped(c))
						return -EINTR;
					continue;
				}
				if (w < 0)
					return -errno;
				done += w;
			}
		}
		if (n == 0)
			return -ENODATA;
		if (n < 0)
			continue; /* EINTR: the loop head checks for a stop */
		in_off += (uint64_t)n;
		out_off += (uint64_t)n;
		bytes -= (uint64_t)n;
		if (c->progress)
			c->progress(c->ctx, (uint64_t)n);
	}
	return 0;
}

void wfs_copy_release(struct wfs_copy *c)
{
	free(c->buf);
	c->buf = NULL;
}
