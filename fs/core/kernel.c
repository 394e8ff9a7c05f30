/* SPDX-License-Identifier: Apache-2.0 */
/* kernel.h: the news the core hands to the handler files. */
#include <stdlib.h>
#include <string.h>

#include "kernel.h"

void wfs_news_name(void *ctx, uint64_t parent, const char *name)
{
	struct wfs_news *k = ctx;
	struct wfs_news_name *p = realloc(k->names, (k->n + 1) * sizeof(*p));

	if (!p)
		return;
	k->names = p;
	p[k->n].parent = parent;
	p[k->n].name = strdup(name);
	if (p[k->n].name)
		k->n++;
}

void wfs_news_release(struct wfs_news *news)
{
	for (size_t i = 0; i < news->n; i++)
		free(news->names[i].name);
	free(news->names);
	*news = (struct wfs_news){0};
}
