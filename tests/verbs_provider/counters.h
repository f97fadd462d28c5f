/* What the tests' verbs provider counts, for tests that check what moved and how (a large
 * message written in place, registrations reused). Get it with dlsym(provider,
 * "loom_test_verbs_counters"); the snapshot is the calling process's, as of the call, in a buffer of the
 * calling thread's. */
#ifndef LOOM_TEST_VERBS_COUNTERS_H
#define LOOM_TEST_VERBS_COUNTERS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct LoomTestVerbsCounters {
  uint64_t send_bytes;           /* SEND payload read from this process's memory */
  uint64_t write_bytes;          /* RDMA WRITE payload placed in this process's memory */
  uint64_t read_bytes;           /* RDMA READ payload placed in this process's memory */
  uint64_t writes_with_imm;      /* RDMA WRITEs with immediate data received */
  uint64_t sends;                /* SENDs received */
  uint64_t rnr_naks;             /* receives not ready (retried) this process met as a sender */
  uint64_t remote_access_errors; /* remote access errors this process met */
  uint64_t registrations;        /* ibv_reg_mr and ibv_reg_dmabuf_mr calls that succeeded */
  uint64_t deregistrations;
  uint64_t unmapped_accesses; /* DMA into or out of a registered region whose memory was unmapped */
  /* The span of memory RDMA WRITEs read from (posted in this process) and wrote into (landed in
   * this process): lowest address, one past the highest; 0 and 0 before the first. */
  uint64_t write_source_begin, write_source_end;
  uint64_t write_target_begin, write_target_end;
  /* GPUDirect RDMA: regions of the emulated device's memory, registered through a dma-buf (the
   * device's exported file) and through ibv_reg_mr on a device pointer (peer memory, allowed only
   * with LOOM_TEST_VERBS_PEERMEM=1). */
  uint64_t dmabuf_registrations;
  uint64_t device_registrations;
} LoomTestVerbsCounters;

const LoomTestVerbsCounters* loom_test_verbs_counters(void);
/* Sets every counter of this process back to zero. */
void loom_test_verbs_reset_counters(void);

#ifdef __cplusplus
}
#endif

#endif
