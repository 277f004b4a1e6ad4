/* tessera.c — the `tessera` binary (tools/main.c's ts_tool_main). */
#include "tools/tools.h"

int main(int argc, char **argv) { return ts_tool_main(argc, argv); }
