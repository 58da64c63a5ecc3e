/* `seqflow worker` and `seqflow launch`: one rank of a distributed run, and N local ranks
 * started together (tools/distributed_cli.c; docs/DISTRIBUTED.md, "Distributed runs"). Each
 * returns the process's exit status. argv[0] is the command's name. seqflow launch is in
 * tools/launch_cli.c. */
#ifndef SEQFLOW_TOOLS_DISTRIBUTED_CLI_H
#define SEQFLOW_TOOLS_DISTRIBUTED_CLI_H

int cmd_worker(int argc, char **argv);
int cmd_launch(int argc, char **argv);

#endif
