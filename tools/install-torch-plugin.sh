#!/usr/bin/env bash
# Builds Loom, installs it (meson install, prefix /usr/local by default), then builds loom_torch,
# Loom's torch.distributed backend, against the installed PyTorch and Loom (found by pkg-config),
# and installs it where /usr/bin/python3 imports it. Afterwards, in any script:
#     import loom_torch
#     torch.distributed.init_process_group("loom")
# Run as root (or with sudo available). PREFIX=/opt/loom tools/install-torch-plugin.sh installs
# Loom elsewhere (the extension records where, so no LD_LIBRARY_PATH is needed).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
PREFIX=${PREFIX:-/usr/local}
PY=/usr/bin/python3

tools/install-deps.sh
if [ ! -f build/build.ninja ]; then meson setup build -Dwerror=true; fi
meson configure build -Dprefix="$PREFIX" >/dev/null
ninja -C build
$SUDO meson install -C build --quiet
$SUDO ldconfig

libdir=$(meson introspect build --buildoptions | $PY -c \
  'import json, sys; print({o["name"]: o["value"] for o in json.load(sys.stdin)}["libdir"])')
export PKG_CONFIG_PATH="$PREFIX/$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$PY integrations/torch/setup.py -q build --build-base "$tmp/build" --build-lib "$tmp/lib" >/dev/null
site=$($PY -c 'import site; print(site.getsitepackages()[0])')
$SUDO mkdir -p "$site"
$SUDO rm -rf "$site/loom_torch"
$SUDO cp -r "$tmp/lib/loom_torch" "$site/"
echo "install-torch-plugin: loom_torch installed in $site, linked to $(pkg-config --variable=libdir loom)/libloom.so"
(cd / && $PY -c 'import loom_torch, torch.distributed as dist; assert "LOOM" in dist.Backend._plugins; print("install-torch-plugin: import loom_torch works; backend \"loom\" registered (%s)" % loom_torch._C.torch_api)')
