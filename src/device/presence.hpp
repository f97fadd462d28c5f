// Whether CUDA is in use in this process, and whether the machine shows it a CUDA device, each
// found without starting CUDA. Loom starts its CUDA runtime only in a process that already uses
// CUDA (a device buffer can exist nowhere else): a program, or a PyTorch process group, that only
// moves host memory never creates a context on a GPU through Loom, and a process forked before
// anything touched CUDA stays free to use it.
#pragma once

namespace loom {
namespace device {

/// True once this process's CUDA driver has been initialised, by Loom or by anyone else (PyTorch,
/// the caller's cudaMalloc), and from then on. Asks the driver only where libcuda is already
/// loaded, and looks for it again only after the process has loaded another library, so the
/// answer costs a few tens of nanoseconds on every collective.
bool cudaDriverInUse();

/// Whether this process may see a CUDA device, decided without loading or starting CUDA: the
/// NVIDIA driver's device files (/dev/nvidiactl and a /dev/nvidiaN, or WSL's /dev/dxg) are there,
/// and CUDA_VISIBLE_DEVICES does not hide every device (empty, -1, or Slurm's NoDevFiles). Read once.
bool cudaDevicesVisible();

}  // namespace device
}  // namespace loom
