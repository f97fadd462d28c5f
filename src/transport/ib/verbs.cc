#include "transport/ib/verbs.hpp"

#include <dlfcn.h>

#include <map>
#include <mutex>

#include "core/format.hpp"
#include "core/param.hpp"

namespace loom {
namespace ib {
namespace {

LOOM_PARAM_STR(libraryParam, "LOOM_IBVERBS_LIBRARY", "",
               "the verbs library the ib transport loads instead of libibverbs.so.1 (a path or a name for dlopen; the "
               "tests' provider)");

struct Loaded {
  Verbs calls{};
  bool ok = false;
  std::string why;
};

template <typename F>
bool bind(void* lib, const char* name, F*& out, std::string* missing) {
  out = reinterpret_cast<F*>(dlsym(lib, name));
  if (out == nullptr && missing->empty()) *missing = name;
  return out != nullptr;
}

Loaded load() {
  Loaded l;
  const std::string path = verbsLibrary();
  // The library stays loaded for the life of the process: devices and contexts outlive any one
  // communicator, and providers register themselves at load.
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (lib == nullptr) {
    const char* err = dlerror();
    l.why = strFormat("cannot load %s (%s)", path.c_str(), err != nullptr ? err : "unknown error");
    return l;
  }
  std::string missing;
  Verbs& v = l.calls;
  bind(lib, "ibv_get_device_list", v.getDeviceList, &missing);
  bind(lib, "ibv_free_device_list", v.freeDeviceList, &missing);
  bind(lib, "ibv_get_device_name", v.getDeviceName, &missing);
  bind(lib, "ibv_open_device", v.openDevice, &missing);
  bind(lib, "ibv_close_device", v.closeDevice, &missing);
  bind(lib, "ibv_query_device", v.queryDevice, &missing);
  bind(lib, "ibv_query_port", v.queryPort, &missing);
  bind(lib, "ibv_query_gid", v.queryGid, &missing);
  bind(lib, "ibv_alloc_pd", v.allocPd, &missing);
  bind(lib, "ibv_dealloc_pd", v.deallocPd, &missing);
  bind(lib, "ibv_reg_mr", v.regMr, &missing);
  bind(lib, "ibv_dereg_mr", v.deregMr, &missing);
  bind(lib, "ibv_create_comp_channel", v.createCompChannel, &missing);
  bind(lib, "ibv_destroy_comp_channel", v.destroyCompChannel, &missing);
  bind(lib, "ibv_create_cq", v.createCq, &missing);
  bind(lib, "ibv_destroy_cq", v.destroyCq, &missing);
  bind(lib, "ibv_get_cq_event", v.getCqEvent, &missing);
  bind(lib, "ibv_ack_cq_events", v.ackCqEvents, &missing);
  bind(lib, "ibv_create_qp", v.createQp, &missing);
  bind(lib, "ibv_modify_qp", v.modifyQp, &missing);
  bind(lib, "ibv_query_qp", v.queryQp, &missing);
  bind(lib, "ibv_destroy_qp", v.destroyQp, &missing);
  bind(lib, "ibv_get_async_event", v.getAsyncEvent, &missing);
  bind(lib, "ibv_ack_async_event", v.ackAsyncEvent, &missing);
  bind(lib, "ibv_wc_status_str", v.wcStatusStr, &missing);
  bind(lib, "ibv_event_type_str", v.eventTypeStr, &missing);
  if (!missing.empty()) {
    l.why = strFormat("%s lacks %s (not a verbs library, or too old)", path.c_str(), missing.c_str());
    return l;
  }
  std::string optional;
  bind(lib, "_ibv_query_gid_ex", v.queryGidEx, &optional);
  bind(lib, "ibv_reg_dmabuf_mr", v.regDmabufMr, &optional);
  l.ok = true;
  return l;
}

}  // namespace

std::string verbsLibrary() {
  const std::string named = libraryParam();
  return named.empty() ? "libibverbs.so.1" : named;
}

const Verbs* verbs(std::string* why) {
  // Loaded once per library: a process that names another one later (a test) gets that one too.
  static std::mutex mu;
  static std::map<std::string, Loaded>* loaded = new std::map<std::string, Loaded>();
  std::lock_guard<std::mutex> lock(mu);
  const std::string path = verbsLibrary();
  auto it = loaded->find(path);
  if (it == loaded->end()) it = loaded->emplace(path, load()).first;
  if (!it->second.ok && why != nullptr) *why = it->second.why;
  return it->second.ok ? &it->second.calls : nullptr;
}

}  // namespace ib
}  // namespace loom
