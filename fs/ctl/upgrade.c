/* SPDX-License-Identifier: Apache-2.0 */
/*
 * weightfsctl upgrade: replace the binary that serves a mount with another, without unmounting,
 * through the mount's holder (fs/upgrade.h has the protocol).
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "ctl.h"
#include "mounts.h"
#include "upgrade.h"

#define EXIT_NO_HOLDER 3

static void upgrade_usage(FILE *out)
{
	fprintf(out, "usage: weightfsctl upgrade [--binary PATH] [--wait SECONDS] [--json] MOUNTPOINT\n\n"
		     "Replace the weightfs binary that serves MOUNTPOINT with PATH (default: the weightfs next\n"
		     "to this weightfsctl), without unmounting: open and mapped files keep working, and\n"
		     "callers only wait. The mount needs a holder (weightfs's default). The server stops\n"
		     "taking creates and opens for writing (they wait for the new one), gives the files open\n"
		     "for writing up to --wait seconds (default %d) to be closed and sealed, finishes the\n"
		     "requests in progress and exits; the holder starts PATH on the same connection, which\n"
		     "adopts the files still open for writing: their writes and close go on. A PATH that\n"
		     "cannot take over (another build whose INIT reply differs, a binary that does not run)\n"
		     "is refused and the old binary serves again; one whose --version does not say weightfs\n"
		     "within 5 s is refused before anything changes. Every upgrade is logged in\n"
		     "STORE/weightfs.log with both pids and both binaries.\n\n"
		     "  --binary PATH   the new weightfs binary\n"
		     "  --wait SECONDS  how long files open for writing get to be closed (0 to 3600)\n"
		     "  --json          machine-readable: {\"mountpoint\", \"old_pid\", \"new_pid\", \"old_binary\",\n"
		     "                  \"new_binary\", \"drain_ms\", \"pause_ms\", \"writers_closed\",\n"
		     "                  \"writers_adopted\", \"writers_lost\"}\n\n"
		     "exit status: 0 upgraded, 1 refused or failed (the old binary serves), 2 usage error,\n"
		     "3 the mount has no holder (weightfs -o noholder, or -f without -o holder) or is not a\n"
		     "weightfs mount\n",
		WFS_UPGRADE_WAIT_MS / 1000);
}

/*
 * Is @binary a weightfs daemon: does `BINARY --version` print "weightfs " within 5 s and exit 0?
 * Asked before the holder is: a server drains for an upgrade and waits up to 30 s for its successor
 * to take over, so a wrong --binary (a script that hangs, another program) stalled every caller of
 * the mount for 30 s before the refusal (found by a new operator). Puts what it printed (its first
 * line, or why not) into @said. Returns true for a weightfs binary.
 */
static bool is_weightfs(const char *binary, char *said, size_t len)
{
	char cmd[4 * PATH_MAX + 64], line[256] = ""; /* each ' of a PATH_MAX path takes 4 */
	const char *q;
	size_t n = 0;
	FILE *p;
	int st;

	/* timeout(1) bounds a binary that hangs; the path goes in single quotes (each ' escaped). */
	n = (size_t)snprintf(cmd, sizeof(cmd), "exec timeout -k 1 5 '");
	for (q = binary; *q; q++)
		n += (size_t)snprintf(cmd + n, sizeof(cmd) - n, *q == '\'' ? "'\\''" : "%c", *q);
	snprintf(cmd + n, sizeof(cmd) - n, "' --version 2>&1 </dev/null");
	p = popen(cmd, "r");
	if (!p) {
		snprintf(said, len, "cannot run it: %s", strerror(errno));
		return false;
	}
	if (!fgets(line, sizeof(line), p))
		line[0] = '\0';
	while (fgetc(p) != EOF)
		;
	st = pclose(p);
	line[strcspn(line, "\n")] = '\0';
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		snprintf(said, len, "its --version %s%s%s", WIFEXITED(st) && WEXITSTATUS(st) == 124 ?
			 "did not answer within 5 s" : "failed", line[0] ? ": " : "", line);
		return false;
	}
	snprintf(said, len, "its --version says \"%s\"", line);
	return strncmp(line, "weightfs ", 9) == 0;
}

/* The weightfs binary next to this program, into @out (PATH_MAX bytes). */
static int default_binary(char *out)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	if (n <= 0)
		return -errno;
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (!slash)
		return -ENOENT;
	*slash = '\0';
	if (snprintf(out, PATH_MAX, "%s/weightfs", self) >= PATH_MAX)
		return -ENAMETOOLONG;
	return 0;
}

/* Connect to the holder of store @store; the descriptor, or -errno. */
static int holder_connect(const char *store)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, n;

	n = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/" WFS_UPGRADE_SOCKET, store);
	if (n < 0 || (size_t)n >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int err = -errno;

		close(fd);
		return err;
	}
	return fd;
}

/* Split @line at tabs into at most @max fields; returns how many. */
static int split_tabs(char *line, char **field, int max)
{
	int n = 0;

	while (n < max) {
		field[n++] = line;
		line = strchr(line, '\t');
		if (!line)
			break;
		*line++ = '\0';
	}
	return n;
}

int wfs_ctl_upgrade(int argc, char **argv)
{
	const char *binary_arg = NULL;
	long wait_s = WFS_UPGRADE_WAIT_MS / 1000;
	bool json = false;
	const struct wfs_ctl_opt opts[] = {
		WFS_CTL_OPT_STRING("binary", 'b', &binary_arg),
		WFS_CTL_OPT_LONG("wait", 'w', &wait_s, 0, WFS_UPGRADE_WAIT_MAX_MS / 1000, NULL),
		WFS_CTL_OPT_FLAG("json", 'j', &json),
		WFS_CTL_OPT_END,
	};
	const struct wfs_ctl_cmd cmd = {"upgrade", upgrade_usage, opts, 1, 1};
	char mnt[PATH_MAX], store[PATH_MAX], binary[PATH_MAX], given[PATH_MAX], answer[3 * PATH_MAX];
	char *f[10], *nl;
	struct pollfd p;
	size_t n = 0;
	int fd, ret, nf;

	ret = wfs_ctl_parse(&cmd, argc, argv);
	if (ret != WFS_CTL_GO_ON)
		return ret;
	if (!realpath(argv[optind], mnt)) {
		fprintf(stderr, "weightfsctl upgrade: %s: %s\n", argv[optind], strerror(errno));
		return 1;
	}
	if (wfs_mounts_on(mnt, store) != 0) {
		fprintf(stderr, "weightfsctl upgrade: %s: not a weightfs mount point\n", argv[optind]);
		return EXIT_NO_HOLDER;
	}
	ret = binary_arg ? (snprintf(given, sizeof(given), "%s", binary_arg) < (int)sizeof(given) ? 0 : -ENAMETOOLONG)
			 : default_binary(given);
	if (ret == 0 && !realpath(given, binary))
		ret = -errno;
	if (ret) {
		fprintf(stderr, "weightfsctl upgrade: %s: %s\n", binary_arg ? binary_arg : "the weightfs next to "
			"weightfsctl", strerror(-ret));
		return 1;
	}
	{
		char said[320];

		if (!is_weightfs(binary, said, sizeof(said))) {
			fprintf(stderr, "weightfsctl upgrade: %s is not a weightfs daemon (%s); nothing changed\n",
				binary, said);
			return 1;
		}
	}
	fd = holder_connect(store);
	if (fd == -ENOENT || fd == -ECONNREFUSED) {
		fprintf(stderr, "weightfsctl upgrade: %s: no holder (nothing listens on %s/" WFS_UPGRADE_SOCKET
			"): the mount was made without -o holder, or its holder died; only a remount with one "
			"can be upgraded in place\n", argv[optind], store);
		return EXIT_NO_HOLDER;
	}
	if (fd == -EACCES) {
		/* The holder may well be there: this user may not reach its socket (the store is private
		 * to its owner). Not exit 3, which says there is no holder. */
		fprintf(stderr, "weightfsctl upgrade: %s: permission denied on the holder's socket %s/"
			WFS_UPGRADE_SOCKET ": only root or the user who mounted it may upgrade\n",
			argv[optind], store);
		return 1;
	}
	if (fd < 0) {
		fprintf(stderr, "weightfsctl upgrade: %s: cannot reach the holder at %s/" WFS_UPGRADE_SOCKET ": %s\n",
			argv[optind], store, strerror(-fd));
		return 1;
	}
	ret = dprintf(fd, "upgrade %ld %s\n", wait_s * 1000, binary);
	/* The answer comes when the new binary serves, or when the holder gave up on it. */
	p = (struct pollfd){.fd = fd, .events = POLLIN};
	while (ret > 0 && n < sizeof(answer) - 1 && !memchr(answer, '\n', n)) {
		ssize_t r;

		if (poll(&p, 1, (int)(wait_s * 1000 + WFS_UPGRADE_QUIET_MS + 2 * WFS_UPGRADE_START_S * 1000 + 20000)) <= 0)
			break;
		r = read(fd, answer + n, sizeof(answer) - 1 - n);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	answer[n] = '\0';
	nl = strchr(answer, '\n');
	if (!nl) {
		fprintf(stderr, "weightfsctl upgrade: %s: the holder gave no answer (STORE/weightfs.log in %s says "
			"what happened)\n", argv[optind], store);
		return 1;
	}
	*nl = '\0';
	nf = split_tabs(answer, f, 10);
	if (strcmp(f[0], "ok") != 0 || nf < 9) {
		fprintf(stderr, "weightfsctl upgrade: %s: refused: %s\n", argv[optind], nf > 1 ? f[1] : answer);
		return 1;
	}
	if (json) {
		json_t *o = json_pack("{s:o, s:i, s:i, s:o, s:o, s:o, s:o, s:i}", "mountpoint",
				      wfs_ctl_json_string(mnt), "old_pid", atoi(f[1]), "new_pid", atoi(f[2]),
				      "old_binary", wfs_ctl_json_string(f[7]), "new_binary", wfs_ctl_json_string(f[8]),
				      "drain_ms", wfs_ctl_json_fixed(strtod(f[3], NULL), 1), "pause_ms",
				      wfs_ctl_json_fixed(strtod(f[4], NULL), 1), "writers_closed", atoi(f[5]));

		/* A holder or new server of an older build does not count the adopted writers: left out. */
		if (o && nf == 10)
			json_object_set_new(o, "writers_adopted", json_integer(atoi(f[9])));
		if (o)
			json_object_set_new(o, "writers_lost", json_integer(atoi(f[6])));
		return wfs_ctl_json_print(o, 0);
	}
	printf("upgrade: %s: server pid %s (%s) replaced by pid %s (%s); drained in %s ms (new opens for "
	       "writing waited), then every request paused %s ms; %s files open for writing were closed first",
	       mnt, f[1], f[7], f[2], f[8], f[3], f[4], f[5]);
	if (nf == 10)
		printf(", %s still open were adopted by the new server (their writes and close go on), %s lost "
		       "their bytes (EIO)\n", f[9], f[6]);
	else
		printf(", %s were still open or lost their bytes (an older build does not tell which: the new "
		       "server's takeover line in STORE/weightfs.log says how many it adopted)\n", f[6]);
	return 0;
}
