/* `seqflow serve` (tools/serve_cli.c): parses its options and the run options, builds the
 * push-mode graph and serves it (pipeline/serve.h) until a stop signal. */
#ifndef SEQFLOW_TOOLS_SERVE_CLI_H
#define SEQFLOW_TOOLS_SERVE_CLI_H

/* argv[0] is "serve". Returns the exit status. */
int cmd_serve(int argc, char **argv);

#endif
