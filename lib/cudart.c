/* SPDX-License-Identifier: Apache-2.0 */
/* cudart.h: the CUDA runtime, loaded at run time. */
#ifdef WFS_HAVE_CUDA
#include "cudart.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Makefile passes the build's $(CUDA_HOME)/lib64. */
#ifndef WFS_CUDART_DIR
#define WFS_CUDART_DIR "/usr/local/cuda/lib64"
#endif

/* Written once, by load() under pthread_once; read-only afterwards. */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static struct wfs_cudart table;
static int load_rc;
static char load_err[PATH_MAX + 256];
static char load_path[PATH_MAX];

static void load(void)
{
	const char *env = getenv("WFS_CUDART");
	const char *missing = NULL;
	char soname[32], first[PATH_MAX + 128] = "";
	void *h;

	snprintf(soname, sizeof(soname), "libcudart.so.%d", CUDART_VERSION / 1000);
	snprintf(load_path, sizeof(load_path), "%s", env && *env ? env : soname);
	h = dlopen(load_path, RTLD_NOW | RTLD_LOCAL);
	if (!h && !(env && *env)) {
		/* Not on the linker's path: the CUDA installation the build used. */
		snprintf(first, sizeof(first), "%s", dlerror());
		snprintf(load_path, sizeof(load_path), "%s/%s", WFS_CUDART_DIR, soname);
		h = dlopen(load_path, RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			snprintf(load_err, sizeof(load_err),
				 "cannot load the CUDA runtime: %s (nor from %s; WFS_CUDART may name its path)", first,
				 WFS_CUDART_DIR);
			load_rc = -ENOTSUP;
			return;
		}
	}
	if (!h) {
		snprintf(load_err, sizeof(load_err), "cannot load the CUDA runtime (WFS_CUDART): %s", dlerror());
		load_rc = -ENOTSUP;
		return;
	}
	/* dlsym's object pointer to a function pointer: what POSIX guarantees dlsym's result converts to. */
#define WFS_CUDART_RESOLVE(name)                                                                         \
	if (!missing && !(table.name = (__typeof__(table.name))dlsym(h, #name)))                         \
		missing = #name;
	WFS_CUDART_FUNCS(WFS_CUDART_RESOLVE)
#undef WFS_CUDART_RESOLVE
	if (missing) {
		snprintf(load_err, sizeof(load_err), "the CUDA runtime %s has no %s (built against CUDA %d.%d)",
			 load_path, missing, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
		memset(&table, 0, sizeof(table));
		dlclose(h);
		load_rc = -ENOTSUP;
		return;
	}
	table.path = load_path;
}

int wfs_cudart_get(const struct wfs_cudart **out, char *err, size_t errlen)
{
	pthread_once(&load_once, load);
	if (load_rc < 0) {
		if (err && errlen)
			snprintf(err, errlen, "%s", load_err);
		return load_rc;
	}
	*out = &table;
	return 0;
}
#endif
