// A library that ends the process that loads it (exit status 7): `tidemark attach --agent` with it
// tests what the injector says when the target exits during the attach.
#include <unistd.h>

__attribute__((constructor)) static void exitOnLoad() { _exit(7); }
