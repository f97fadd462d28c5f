#!/usr/bin/env bash
# Installs what Loom needs to build and test on Debian 12 (run as root, or with sudo available).
# Optional extras are installed too: hwloc, rdma-core, Open MPI (the mpirun test, bench/compare),
# Gloo (bench/compare), clang with libFuzzer (tools/fuzz.sh), and Slurm with munge (a real
# single-node Slurm for the srun tests, started by tools/slurm-local), and PyTorch with its C++
# headers, pybind11 and pytest (the torch.distributed backend in integrations/torch and its tests).
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
pkgs=(build-essential meson ninja-build pkg-config libssl-dev libgtest-dev libgmock-dev libbenchmark-dev
      libhwloc-dev libibverbs-dev openmpi-bin libopenmpi-dev libgloo-dev iproute2 iperf3 python3-matplotlib
      clang libclang-rt-14-dev slurm-wlm munge python3-torch libtorch-dev pybind11-dev python3-pytest)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
