// The Python module loom_torch._C: the backend factory torch.distributed calls, and the launcher
// detection that spares users computing rank and world size from SLURM_* or OMPI_* by hand.
#include <dlfcn.h>
#include <loom/loom.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

#include "backend.hpp"
#include "device.hpp"

namespace py = pybind11;

namespace {

c10::intrusive_ptr<loom_torch::BackendBase> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                   const std::chrono::duration<float>& timeout,
                                                   const std::string& groupId) {
  return loom_torch::createProcessGroupLoom(store, rank, size,
                                            std::chrono::duration_cast<std::chrono::milliseconds>(timeout), groupId);
}

c10::intrusive_ptr<loom_torch::BackendBase> createGroup(const c10::intrusive_ptr<loom_torch::BackendBase>& parent,
                                                        const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                        int size, const std::chrono::duration<float>& timeout,
                                                        const std::string& groupId,
                                                        const std::vector<int64_t>& globalRanks) {
  return loom_torch::createProcessGroupLoom(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout), groupId, parent, globalRanks);
}

// A blocking sum all-reduce of `t` straight on the backend's Loom communicator, with none of
// torch.distributed's machinery around it (no Work, no Future): what bench/torch_allreduce.py
// measures the backend's overhead against.
void allReduceDirect(const c10::intrusive_ptr<loom_torch::BackendBase>& backend, at::Tensor& t) {
  auto* pg = dynamic_cast<loom_torch::ProcessGroupLoom*>(backend.get());
  TORCH_CHECK(pg != nullptr, "loom: all_reduce_direct: not a loom process group");
  TORCH_CHECK(t.is_contiguous() && t.scalar_type() == at::kFloat && t.device().is_cpu(),
              "loom: all_reduce_direct: takes a contiguous float32 CPU tensor");
  pg->communicator().allReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), loom::DataType::Float32,
                               loom::ReduceOp::Sum);
}

// The links the backend's communicator holds now (Communicator::linkCount).
int linkCount(const c10::intrusive_ptr<loom_torch::BackendBase>& backend) {
  auto* pg = dynamic_cast<loom_torch::ProcessGroupLoom*>(backend.get());
  TORCH_CHECK(pg != nullptr, "loom: link_count: not a loom process group");
  return pg->communicator().linkCount();
}

py::dict launch() {
  const loom::Launch l = loom::launchFromEnv();
  py::dict d;
  d["launcher"] = l.launcher;
  d["rank"] = l.rank;
  d["world_size"] = l.size;
  d["local_rank"] = l.localRank;
  d["local_world_size"] = l.localSize;
  d["master_addr"] = l.masterAddr;
  d["master_port"] = l.masterPort;
  py::dict from;
  for (const auto& p : l.provenance) from[py::str(p.first)] = p.second;
  d["provenance"] = from;
  return d;
}

// The libloom loaded now was built from the headers this module was compiled against (setup.py
// checked the one it linked; another may be found at run time): else a type's layout may differ
// between the two, and the first call would crash instead of failing.
void checkLoadedLoom() {
  const char* digest = loomGetHeadersDigest();
  if (std::string(digest) == LOOM_TORCH_HEADERS_DIGEST) return;
  Dl_info where{};
  dladdr(reinterpret_cast<void*>(&loomGetHeadersDigest), &where);
  throw py::import_error(std::string("loom_torch was compiled against Loom ") + LOOM_TORCH_BUILT_WITH + " (headers " +
                         LOOM_TORCH_HEADERS_DIGEST + "), but the libloom loaded now, " +
                         (where.dli_fname != nullptr ? where.dli_fname : "(unknown path)") + ", is Loom " +
                         loomGetBuildId() + " (headers " + digest +
                         "): reinstall or rebuild loom_torch against the Loom it will load");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  checkLoadedLoom();
  // The c10d types (Store, ProcessGroup/Backend) are registered by torch.distributed.
  py::module::import("torch.distributed");
  m.doc() = "Loom collectives as a torch.distributed backend";
  m.def("create_backend", &create, py::arg("store"), py::arg("rank"), py::arg("world_size"), py::arg("timeout"),
        py::arg("group_id") = "", py::call_guard<py::gil_scoped_release>(),
        "Joins the Loom communicator of a process group (called by init_process_group / new_group); the "
        "backends of one group_id for several device types share one.");
  m.def("create_group_backend", &createGroup, py::arg("parent"), py::arg("store"), py::arg("rank"),
        py::arg("world_size"), py::arg("timeout"), py::arg("group_id"), py::arg("global_ranks"),
        py::call_guard<py::gil_scoped_release>(),
        "As create_backend, for a group of the default group: where `parent` is its Loom backend, the group is "
        "made from parent's communicator by the ranks `global_ranks` alone (no new rendezvous); else as "
        "create_backend.");
  m.def("launch", &launch,
        "What the launcher (srun, mpirun, torchrun, loomrun) says about this process: rank, world_size, "
        "local_rank, local_world_size, master_addr, master_port, launcher, and where each came from. Raises "
        "RuntimeError when no launcher variable is set.");
  m.def("all_reduce_direct", &allReduceDirect, py::arg("backend"), py::arg("tensor"),
        py::call_guard<py::gil_scoped_release>(),
        "Sum all-reduce of a float32 CPU tensor on the group's Loom communicator directly, bypassing "
        "torch.distributed (for measuring the backend's overhead). On PyTorch 2 pass "
        "group._get_backend(torch.device('cpu')).");
  m.def("link_count", &linkCount, py::arg("backend"),
        "The peers the group's Loom communicator holds a link to now (links are made on first use above 8 "
        "ranks). On PyTorch 2 pass group._get_backend(torch.device('cpu')).");
  m.attr("has_cuda") = loom_torch::builtWithCuda();
  m.attr("loom_build_id") = loomGetBuildId();
  m.attr("torch_api") = TORCH_VERSION_MAJOR >= 2 ? "c10d::Backend" : "c10d::ProcessGroup";
}
