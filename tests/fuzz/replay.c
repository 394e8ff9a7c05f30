/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Replay a libFuzzer corpus without libFuzzer: every file in the directories (or files) given is fed
 * to LLVMFuzzerTestOneInput once, so `make check` keeps the crashers found by `make fuzz` fixed with
 * a plain cc build. A failing input aborts (the target's checks, or a sanitizer in `make asan`).
 *   usage: fuzz_replay DIR|FILE...
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf = NULL;
	size_t len = 0, cap = 0, n;

	if (!f) {
		fprintf(stderr, "fuzz_replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	do {
		if (len == cap) {
			unsigned char *grown = realloc(buf, cap = cap ? 2 * cap : 4096);

			if (!grown) {
				free(buf);
				fclose(f);
				return -1;
			}
			buf = grown;
		}
		n = fread(buf + len, 1, cap - len, f);
		len += n;
	} while (n > 0);
	fclose(f);
	/* An exact-size copy, so a read past the input is a read past an allocation under ASan. */
	{
		unsigned char *exact = malloc(len ? len : 1);

		if (!exact) {
			free(buf);
			return -1;
		}
		memcpy(exact, buf, len);
		free(buf);
		LLVMFuzzerTestOneInput(exact, len);
		free(exact);
	}
	return 0;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
	size_t inputs = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: fuzz_replay DIR|FILE...\n");
		return 2;
	}
	for (int a = 1; a < argc; a++) {
		struct stat st;
		struct dirent *e;
		char **names = NULL;
		size_t n = 0;
		DIR *d;

		if (stat(argv[a], &st) < 0) {
			fprintf(stderr, "fuzz_replay: %s: %s\n", argv[a], strerror(errno));
			return 1;
		}
		if (!S_ISDIR(st.st_mode)) {
			if (replay_file(argv[a]))
				return 1;
			inputs++;
			continue;
		}
		d = opendir(argv[a]);
		while (d && (e = readdir(d)) != NULL) {
			char **grown;

			if (e->d_name[0] == '.')
				continue;
			grown = realloc(names, (n + 1) * sizeof(*names));
			if (!grown || !(grown[n] = malloc(strlen(argv[a]) + strlen(e->d_name) + 2)))
				return 1;
			names = grown;
			sprintf(names[n++], "%s/%s", argv[a], e->d_name);
		}
		if (d)
			closedir(d);
		if (n)
			qsort(names, n, sizeof(*names), name_cmp);
		for (size_t i = 0; i < n; i++) {
			if (replay_file(names[i]))
				return 1;
			free(names[i]);
			inputs++;
		}
		free(names);
	}
	if (inputs == 0) {
		fprintf(stderr, "fuzz_replay: no inputs\n");
		return 1;
	}
	printf("fuzz replay: %zu inputs, none crashed, every parsed header round-tripped\n", inputs);
	return 0;
}
