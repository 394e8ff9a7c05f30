/*
 * Subcommands of weightfsctl, the admin command line. Each takes the arguments after its own name
 * (argv[0] is the subcommand name), prints what it did or one clear error line, and returns the
 * process exit status: 0 on success, 1 when the work found or hit a problem, 2 on a usage error.
 */
#ifndef WFS_CMD_H
#define WFS_CMD_H

int wfs_cmd_stat(int argc, char **argv);
int wfs_cmd_stage(int argc, char **argv);

#endif
