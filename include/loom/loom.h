/*
 * Loom C API — collective communication for host (and, with CUDA, device) buffers.
 *
 * Shaped like NCCL's API so that an NCCL user recognises it: a 128-byte unique id made by one
 * rank and passed to the others, communicators created per rank, result codes, a stream
 * argument on every operation, and group start/end for batching point-to-point calls.
 *
 * Threading: a communicator may be used from one thread at a time for operations; loomCommAbort
 * and loomCommGetAsyncError may be called from any thread at any time.
 *
 * Semantics on host buffers (stream == NULL): every operation blocks until it is complete on
 * this rank (its buffers may be reused when the call returns). Inside loomGroupStart /
 * loomGroupEnd, loomSend and loomRecv are only recorded; loomGroupEnd posts them all at once and
 * returns when all are complete, so exchanges such as a ring shift cannot deadlock.
 *
 * Errors: every function returns a loomResult_t. The text of the last error raised on the calling
 * thread is kept for loomGetLastError(). A communicator whose peer failed or which timed out is
 * marked failed: every later call returns the original cause.
 */
#ifndef LOOM_LOOM_H_
#define LOOM_LOOM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_MAJOR 0
#define LOOM_MINOR 1
#define LOOM_PATCH 0
/** Version as one integer: major * 10000 + minor * 100 + patch. */
#define LOOM_VERSION_CODE (LOOM_MAJOR * 10000 + LOOM_MINOR * 100 + LOOM_PATCH)

/** Result codes. The first eight have the meaning of NCCL's codes of the same position. */
typedef enum {
  loomSuccess = 0,
  loomUnhandledCudaError = 1, /**< a CUDA call failed */
  loomSystemError = 2,        /**< a system call failed (socket, memory, file) */
  loomInternalError = 3,      /**< a bug in Loom */
  loomInvalidArgument = 4,    /**< a bad argument: null buffer, bad count, unknown datatype or op */
  loomInvalidUsage = 5,       /**< a bad sequence of calls, or mismatched calls across ranks */
  loomRemoteError = 6,        /**< a peer failed, closed its connection or sent something malformed */
  loomInProgress = 7,         /**< the operation has not completed yet (non-blocking queries) */
  loomTimeout = 8,            /**< a deadline passed: the message names what was awaited */
  loomAborted = 9,            /**< the communicator was aborted */
  loomNumResults = 10
} loomResult_t;

/** Element types. Aliases follow NCCL's names. */
typedef enum {
  loomInt8 = 0,
  loomChar = 0,
  loomUint8 = 1,
  loomInt32 = 2,
  loomInt = 2,
  loomUint32 = 3,
  loomInt64 = 4,
  loomUint64 = 5,
  loomFloat16 = 6,
  loomHalf = 6,
  loomFloat32 = 7,
  loomFloat = 7,
  loomFloat64 = 8,
  loomDouble = 8,
  loomBfloat16 = 9,
  loomNumTypes = 10
} loomDataType_t;

/** Reduction operations. loomAvg is a sum divided once by the number of ranks. */
typedef enum { loomSum = 0, loomProd = 1, loomMax = 2, loomMin = 3, loomAvg = 4, loomNumOps = 5 } loomRedOp_t;

/** Opaque communicator handle. */
typedef struct loomComm* loomComm_t;

/**
 * A stream. Collectives on CUDA device buffers (Loom built with CUDA) are ordered on it with
 * NCCL's semantics: the call returns once the collective is queued; the collective reads its input
 * after the work queued on the stream before the call, and work queued after the call waits for
 * it; the host is not blocked (a failure surfaces through loomCommGetAsyncError, and never leaves
 * the stream held). NULL: host buffers, or the legacy default stream for device buffers. A stream
 * being captured into a CUDA graph is rejected (loomInvalidUsage); a mix of host and device
 * buffers in one call is loomInvalidArgument. Send and receive take streams too (within a group,
 * one stream per communicator); the barrier synchronises hosts and takes NULL only.
 */
typedef void* loomStream_t;

#define LOOM_UNIQUE_ID_BYTES 128
/**
 * Identifies one communicator's rendezvous: where its store listens and the job secret that
 * every connection must prove it knows. Made by loomGetUniqueId on one rank and passed, as
 * bytes, to all the others (through MPI_Bcast, a file, an environment variable...).
 * Treat it as a secret: anyone holding it can join the communicator.
 */
typedef struct {
  char internal[LOOM_UNIQUE_ID_BYTES];
} loomUniqueId;

/**
 * Options for loomCommInitRankConfig and loomCommInitFromEnv. Initialise with
 * LOOM_CONFIG_INITIALIZER; a field left at its initial value takes the default (or its
 * environment variable, shown beside it).
 */
typedef struct {
  size_t size;            /**< sizeof(loomConfig_t), set by the initializer */
  unsigned int magic;     /**< set by the initializer */
  unsigned int version;   /**< LOOM_VERSION_CODE, set by the initializer */
  int timeoutMs;          /**< deadline of every wait (LOOM_TIMEOUT, seconds; default 300 s); -1: default */
  int initTimeoutMs;      /**< deadline of rendezvous (LOOM_INIT_TIMEOUT, seconds; default 120 s); -1: default */
  const char* name;       /**< communicator name used in logs and errors; NULL: "loom" */
  const char* transports; /**< transports allowed, e.g. "tcp" (LOOM_TRANSPORT); NULL: all */
  int socketsPerPeer;     /**< TCP sockets striped per peer (LOOM_SOCKETS_PER_PEER); -1: default */
  int reproducible;       /**< 1: reproducible mode, 0: off (LOOM_REPRODUCIBLE; default off); -1: default.
                               Float sum, avg and prod reductions then return the same bits whatever the
                               message size, algorithm, transport, buffers or node layout
                               (docs/reproducibility.md); every rank must pass the same value. */
} loomConfig_t;

#define LOOM_CONFIG_MAGIC 0x4c4f4f4du
#define LOOM_CONFIG_INITIALIZER \
  { sizeof(loomConfig_t), LOOM_CONFIG_MAGIC, LOOM_VERSION_CODE, -1, -1, NULL, NULL, -1, -1 }

/** Writes LOOM_VERSION_CODE of the library actually linked. */
loomResult_t loomGetVersion(int* version);

/** The library's version and the commit it was built from, e.g. "0.1.0+4acc468d1a2b" ("-dirty"
 * after it where the tree had uncommitted changes; "unknown" outside a git checkout). */
const char* loomGetBuildId(void);

/**
 * A digest of the public headers (loom.h, loom.hpp, ddp.hpp) the library was compiled with: 16 hex
 * digits of SHA-256 over each file's name, length and contents, in that order. Code compiled
 * against other headers may disagree with the library on a type's layout; a program or extension
 * that records the digest of the headers it was compiled with can refuse to run against another
 * library (the PyTorch extension does so at import).
 */
const char* loomGetHeadersDigest(void);

/**
 * Creates a new unique id and starts, in this process, the rendezvous store it points to. The
 * store listens on the interface chosen by LOOM_SOCKET_IFNAME, on a free port (or on
 * LOOM_STORE_PORT where set), and stays up until the process exits.
 */
loomResult_t loomGetUniqueId(loomUniqueId* uniqueId);

/** Creates the communicator of rank `rank` among `nranks`; blocks until all ranks have joined. */
loomResult_t loomCommInitRank(loomComm_t* comm, int nranks, loomUniqueId commId, int rank);

/** As loomCommInitRank, with options (config may be NULL). */
loomResult_t loomCommInitRankConfig(loomComm_t* comm, int nranks, loomUniqueId commId, int rank,
                                    const loomConfig_t* config);

/**
 * Creates a communicator from the environment a launcher sets: loomrun and torchrun (RANK,
 * WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Slurm's srun (SLURM_PROCID, SLURM_NTASKS,
 * SLURM_STEP_NODELIST...), Open MPI's mpirun (OMPI_COMM_WORLD_RANK...) and MPICH's Hydra
 * (PMI_RANK, PMI_SIZE). LOOM_RANK / LOOM_WORLD_SIZE / LOOM_MASTER_ADDR / LOOM_MASTER_PORT beat
 * them all. Rank 0 hosts the rendezvous store. `loom-info --env` prints what is detected.
 */
loomResult_t loomCommInitFromEnv(loomComm_t* comm, const loomConfig_t* config);

/** The color of a rank that takes no part in loomCommSplit (its newcomm is set to NULL). */
#define LOOM_SPLIT_NOCOLOR (-1)

/**
 * Sub-communicators, as ncclCommSplit: collective over `comm` (every rank calls it, in the same
 * order as its other collectives). The ranks passing the same `color` (0 or more) form one new
 * communicator, ranked by `key`, ties broken by their rank in `comm`; a rank passing
 * LOOM_SPLIT_NOCOLOR takes part and gets NULL. No new rendezvous (they meet through `comm`'s store)
 * and `comm`'s options; the new communicators outlive `comm` if it is destroyed first.
 */
loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t* newcomm);

/**
 * Waits until every operation this rank has queued on `comm` has completed (those on device
 * buffers, which return once ordered on their stream, included), as ncclCommFinalize flushes them,
 * then returns the communicator's first error, if any. The communicator stays valid until destroyed.
 */
loomResult_t loomCommFinalize(loomComm_t comm);

/** Frees the communicator. Operations still in flight on it fail with loomAborted. */
loomResult_t loomCommDestroy(loomComm_t comm);

/**
 * Marks the communicator aborted, unblocks every wait on it (they return loomAborted), and frees
 * it. Safe from any thread.
 */
loomResult_t loomCommAbort(loomComm_t comm);

/** Writes loomSuccess, or the code of the error that marked the communicator failed. Any thread. */
loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t* asyncError);

/** Number of ranks. */
loomResult_t loomCommCount(const loomComm_t comm, int* count);

/** This rank. */
loomResult_t loomCommUserRank(const loomComm_t comm, int* rank);

/** This rank's place among the ranks of its node (ranks that can share memory; LOOM_HOST_ID), and
 *  how many ranks the node has: use localRank to pick this rank's GPU. */
loomResult_t loomCommLocalRank(const loomComm_t comm, int* localRank, int* localSize);

/** Number of nodes in the communicator. */
loomResult_t loomCommNodeCount(const loomComm_t comm, int* nodes);

/** A short text for a result code. */
const char* loomGetErrorString(loomResult_t result);

/**
 * The full message of the last error raised on the calling thread (comm may be NULL), or of the
 * error that marked `comm` failed. Valid until the next Loom call on this thread.
 */
const char* loomGetLastError(loomComm_t comm);

/* ---- Collectives. Counts are numbers of elements; sendbuff == recvbuff means in place. ---- */

/** recvbuff[i] = op over ranks of sendbuff[i], on every rank. */
loomResult_t loomAllReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomRedOp_t op,
                           loomComm_t comm, loomStream_t stream);

/** Copies root's sendbuff into every rank's recvbuff (sendbuff is read on the root only). */
loomResult_t loomBroadcast(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, int root,
                           loomComm_t comm, loomStream_t stream);

/** recvbuff on the root only = op over ranks of sendbuff. */
loomResult_t loomReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomRedOp_t op,
                        int root, loomComm_t comm, loomStream_t stream);

/** recvbuff[r * sendcount + i] = sendbuff[i] of rank r. recvbuff holds nranks * sendcount. */
loomResult_t loomAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, loomDataType_t datatype,
                           loomComm_t comm, loomStream_t stream);

/** recvbuff[i] = op over ranks of sendbuff[rank * recvcount + i]. sendbuff holds nranks * recvcount. */
loomResult_t loomReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, loomDataType_t datatype,
                               loomRedOp_t op, loomComm_t comm, loomStream_t stream);

/** recvbuff[r * count + i] = sendbuff[rank * count + i] of rank r. Both hold nranks * count. */
loomResult_t loomAllToAll(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomComm_t comm,
                          loomStream_t stream);

/**
 * recvbuff[r * count + i] = sendbuff[i] of rank r, on `root` (as ncclGather): recvbuff holds
 * nranks * count there and is ignored elsewhere (it may be NULL). In place on the root: sendbuff ==
 * recvbuff + root * count elements.
 */
loomResult_t loomGather(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, int root,
                        loomComm_t comm, loomStream_t stream);

/**
 * recvbuff[i] = sendbuff[rank * count + i] of `root` (as ncclScatter): sendbuff holds nranks * count
 * there and is ignored elsewhere (it may be NULL). In place on the root: recvbuff == sendbuff + root
 * * count elements.
 */
loomResult_t loomScatter(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, int root,
                         loomComm_t comm, loomStream_t stream);

/** Returns once every rank has entered the barrier. */
loomResult_t loomBarrier(loomComm_t comm, loomStream_t stream);

/* ---- Point-to-point. Messages between one pair of ranks arrive in the order they were sent. ---- */

/** Sends count elements to peer. Matches the peer's loomRecv of the same count and datatype. */
loomResult_t loomSend(const void* sendbuff, size_t count, loomDataType_t datatype, int peer, loomComm_t comm,
                      loomStream_t stream);

/** The peer of a receive from any rank (this one included): the earliest message from whichever
 * rank, in arrival order (each rank's in the order it sent them). Device buffers are staged through
 * host memory. */
#define LOOM_ANY_SOURCE (-1)

/** Receives count elements from peer (or LOOM_ANY_SOURCE). A larger incoming message is an error,
 * never a truncation. */
loomResult_t loomRecv(void* recvbuff, size_t count, loomDataType_t datatype, int peer, loomComm_t comm,
                      loomStream_t stream);

/** Receives up to count elements from any rank, as loomRecv with LOOM_ANY_SOURCE (blocking),
 * and says who sent them (*source) and how many elements came (*received; either may be NULL).
 * Not inside a group. */
loomResult_t loomRecvAny(void* recvbuff, size_t count, loomDataType_t datatype, loomComm_t comm, int* source,
                         size_t* received);

/** Starts recording loomSend/loomRecv calls on this thread; groups nest. */
loomResult_t loomGroupStart(void);

/**
 * Posts every call recorded since the outermost loomGroupStart, receives first: host ones are waited
 * for; those on device buffers are queued on their stream as one group and not waited for.
 */
loomResult_t loomGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LOOM_H_ */
