// Verbs: libibverbs, loaded at run time, so that one build of Loom runs on machines with and
// without rdma-core (as NCCL does). The library is libibverbs.so.1, or the one LOOM_IBVERBS_LIBRARY
// names (the tests' strict provider, tests/verbs_provider). Only calls that go through the library
// are here; the data path (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) is inline
// in <infiniband/verbs.h> and goes through the ops table of the context the provider made.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace loom {
namespace ib {

struct Verbs {
  ibv_device** (*getDeviceList)(int* count);
  void (*freeDeviceList)(ibv_device** list);
  const char* (*getDeviceName)(ibv_device* device);
  ibv_context* (*openDevice)(ibv_device* device);
  int (*closeDevice)(ibv_context* context);
  int (*queryDevice)(ibv_context* context, ibv_device_attr* attr);
  /// The library's exported ibv_query_port (verbs.h wraps it in an inline of the same name).
  int (*queryPort)(ibv_context* context, uint8_t port, ibv_port_attr* attr);
  int (*queryGid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid);
  /// Optional (rdma-core 32 and later): a GID with its type. Null where absent.
  int (*queryGidEx)(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry, uint32_t flags,
                    size_t entrySize);
  ibv_pd* (*allocPd)(ibv_context* context);
  int (*deallocPd)(ibv_pd* pd);
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, size_t length, int access);
  /// Optional (rdma-core 34 and later): registers a dma-buf (GPUDirect RDMA). Null where absent.
  ibv_mr* (*regDmabufMr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access);
  int (*deregMr)(ibv_mr* mr);
  ibv_comp_channel* (*createCompChannel)(ibv_context* context);
  int (*destroyCompChannel)(ibv_comp_channel* channel);
  ibv_cq* (*createCq)(ibv_context* context, int cqe, void* cqContext, ibv_comp_channel* channel, int vector);
  int (*destroyCq)(ibv_cq* cq);
  int (*getCqEvent)(ibv_comp_channel* channel, ibv_cq** cq, void** cqContext);
  void (*ackCqEvents)(ibv_cq* cq, unsigned int count);
  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  int (*queryQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init);
  int (*destroyQp)(ibv_qp* qp);
  int (*getAsyncEvent)(ibv_context* context, ibv_async_event* event);
  void (*ackAsyncEvent)(ibv_async_event* event);
  const char* (*wcStatusStr)(ibv_wc_status status);
  const char* (*eventTypeStr)(ibv_event_type type);
};

/// The calls of the library verbsLibrary() names, loaded at the first call that names it; null
/// when it cannot be loaded or lacks a call, and then *why (if given) says why, in a phrase.
const Verbs* verbs(std::string* why = nullptr);
/// The library verbs() loads (LOOM_IBVERBS_LIBRARY, else libibverbs.so.1).
std::string verbsLibrary();

}  // namespace ib
}  // namespace loom
