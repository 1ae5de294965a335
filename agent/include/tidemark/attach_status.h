/* What `tidemark attach` and `tidemark detach` read from the target's memory (the exported
 * variable tidemark_attach_status) to learn what the agent is doing, without stopping it. */
#ifndef TIDEMARK_ATTACH_STATUS_H
#define TIDEMARK_ATTACH_STATUS_H

#include <stdint.h>

enum {
  TIDEMARK_ATTACH_NONE = 0,      /* loaded, never attached */
  TIDEMARK_ATTACH_STARTING = 1,  /* the attach thread runs */
  TIDEMARK_ATTACH_RECORDING = 2, /* attached: recording into session_id */
  TIDEMARK_ATTACH_FAILED = 3,    /* the attach did not complete: message says why */
  TIDEMARK_ATTACH_STOPPING = 4,  /* the detach thread runs */
  TIDEMARK_ATTACH_DORMANT = 5,   /* detached: loaded, recording nothing */
  TIDEMARK_ATTACH_PRELOADED = 6  /* started under `tidemark run`: records until the job exits */
};

struct tidemark_attach_status_t {
  volatile int32_t state;
  volatile uint32_t generation; /* +1 each time an attach or detach finishes */
  volatile uint64_t session_id;
  volatile uint64_t patched_entries; /* GOT entries pointed at the hooks */
  volatile int32_t python;           /* 1: the adapter started inside CPython */
  char message[500];
};

#endif
