"""Builds loom_torch, Loom's torch.distributed backend, against the installed PyTorch.

Loom itself is found with pkg-config (`loom.pc`, installed by `meson install`; for a build tree,
PKG_CONFIG_PATH=<build>/meson-uninstalled), or from LOOM_CFLAGS and LOOM_LIBS where both are set
(a machine without pkg-config). The extension records Loom's library directory as its rpath, so no
LD_LIBRARY_PATH is needed. Against PyTorch built with CUDA (torch.version.cuda set, and the CUDA
toolkit found), the backend also takes CUDA tensors (csrc/device.cc, LOOM_TORCH_CUDA).

    /usr/bin/python3 setup.py build --build-base BUILD_DIR --build-lib OUT_DIR
"""
import ctypes
import hashlib
import os
import subprocess
import sys

from setuptools import setup
import torch
from torch.utils import cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension


def pkg_config(what):
    env = {"--cflags": "LOOM_CFLAGS", "--libs": "LOOM_LIBS"}
    if os.environ.get("LOOM_CFLAGS") is not None and os.environ.get("LOOM_LIBS") is not None:
        if what == "--modversion":
            return ["0"]
        return os.environ[env[what]].split()
    try:
        out = subprocess.check_output(["pkg-config", what, "loom"], text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(
            "loom_torch: pkg-config cannot find Loom (%s). Install it (meson install -C build) or point "
            "PKG_CONFIG_PATH at <build>/meson-uninstalled." % e)
    return out.split()


# --stamp FILE (for Meson): touched after a successful build.
stamp = None
if "--stamp" in sys.argv:
    i = sys.argv.index("--stamp")
    stamp = os.path.abspath(sys.argv[i + 1])
    del sys.argv[i:i + 2]

# Paths below are relative to this folder, wherever the build runs from.
os.chdir(os.path.dirname(os.path.abspath(__file__)))

# CUDA tensors: PyTorch's CUDA headers and libraries (c10_cuda, torch_cuda) and the toolkit's headers.
with_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
# The CUDA path compiled on a machine whose PyTorch has no CUDA (tools/torch2-env build-cuda, in CI):
# the headers PyTorch's CUDA build adds, from LOOM_TORCH_CUDA_HEADERS, and the toolkit's. The result
# links with its CUDA symbols left for load time, which only a PyTorch with CUDA can satisfy: it
# checks that the code compiles, and is not for importing.
cuda_headers = os.environ.get("LOOM_TORCH_CUDA_HEADERS")
Extension = CppExtension
defines = []
if with_cuda or cuda_headers:
    # PyTorch's c10/cuda/CUDAEvent.h aligns with std::hardware_destructive_interference_size, which
    # gcc 12+ warns about in every file that includes it.
    defines = ["-DLOOM_TORCH_CUDA", "-Wno-interference-size"]
if with_cuda:
    from torch.utils.cpp_extension import CUDAExtension
    Extension = CUDAExtension
elif cuda_headers:
    toolkit = cpp_extension.CUDA_HOME or "/usr/local/cuda"
    if not os.path.isfile(os.path.join(toolkit, "include", "cuda_runtime_api.h")):
        raise SystemExit("loom_torch: LOOM_TORCH_CUDA_HEADERS is set, but the CUDA toolkit's headers are not in %s "
                         "(set CUDA_HOME)" % toolkit)
    # -isystem: their own warnings are not this extension's.
    defines += ["-isystem", cuda_headers, "-isystem", os.path.join(toolkit, "include")]

# The C++ library ABI PyTorch was built with: recent PyTorch no longer passes it to extensions, and a
# compiler whose default differs (some toolchains default to the old std::string) builds an
# extension that crashes at its first call with a std::string into libtorch or Loom.
abi = ["-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]

cflags = pkg_config("--cflags")
libs = pkg_config("--libs")
rpaths = ["-Wl,-rpath," + flag[2:] for flag in libs if flag.startswith("-L")]


def headers_digest(include_dir):
    """tools/build_id.py's digest of Loom's public headers in include_dir/loom."""
    h = hashlib.sha256()
    for name in ("loom.h", "loom.hpp", "ddp.hpp"):
        with open(os.path.join(include_dir, "loom", name), "rb") as f:
            data = f.read()
        h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()[:16]


def loom_headers_and_library():
    """The digest of the headers this build compiles against, and the digest and build id the
    libloom it links reports. An extension compiled against one Loom's headers and loaded with
    another's library may disagree with it on a type's layout: a crash at the first call."""
    dirs = [f[2:] for f in cflags if f.startswith("-I")] + ["/usr/local/include", "/usr/include"]
    include = next((d for d in dirs if os.path.isfile(os.path.join(d, "loom", "loom.hpp"))), None)
    if include is None:
        raise SystemExit("loom_torch: Loom's headers (loom/loom.hpp) are in none of " + " ".join(dirs))
    names = [os.path.join(f[2:], "libloom.so") for f in libs if f.startswith("-L")] + ["libloom.so.0"]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise SystemExit("loom_torch: cannot load libloom (tried %s)" % ", ".join(names))
    for fn in (lib.loomGetHeadersDigest, lib.loomGetBuildId):
        fn.restype = ctypes.c_char_p
    return headers_digest(include), lib.loomGetHeadersDigest().decode(), lib.loomGetBuildId().decode(), include


digest, lib_digest, build_id, include = loom_headers_and_library()
if digest != lib_digest:
    raise SystemExit("loom_torch: Loom's headers in %s (digest %s) are not those libloom %s was built with (%s): "
                     "rebuild Loom, or point LOOM_CFLAGS / PKG_CONFIG_PATH at its own headers" %
                     (include, digest, build_id, lib_digest))
# Checked again at import, against the libloom then loaded (csrc/module.cc).
stamp_defines = ['-DLOOM_TORCH_HEADERS_DIGEST="%s"' % digest, '-DLOOM_TORCH_BUILT_WITH="%s"' % build_id]

# Under Meson the compiler lines go to <stamp>.log, and to the terminal only when the build fails.
log = None
if stamp:
    sys.stdout.flush()
    log = open(stamp + ".log", "w")
    saved = os.dup(1)
    os.dup2(log.fileno(), 1)

try:
    setup(
        name="loom_torch",
        version=pkg_config("--modversion")[0],
        description="Loom collectives as a torch.distributed backend",
        packages=["loom_torch"],
        ext_modules=[
            Extension(
                "loom_torch._C",
                sources=["csrc/module.cc", "csrc/backend.cc", "csrc/work.cc", "csrc/tensors.cc", "csrc/sparse.cc",
                         "csrc/coalesced.cc", "csrc/device.cc"],
                extra_compile_args=cflags + defines + abi + stamp_defines + ["-std=c++17", "-O2", "-Wall", "-Wno-unused-parameter",
                                             "-Wno-deprecated-declarations",
                                             # gcc 13+ warns inside PyTorch 2.x's own headers
                                             "-Wno-dangling-reference", "-Werror"],
                extra_link_args=libs + rpaths,
            )
        ],
        cmdclass={"build_ext": BuildExtension},
    )
except BaseException:
    if log:
        sys.stdout.flush()
        os.dup2(saved, 1)
        log.close()
        sys.stderr.write(open(stamp + ".log").read())
    raise

if stamp:
    sys.stdout.flush()
    os.dup2(saved, 1)
    log.close()
    with open(stamp, "w") as f:
        f.write("built\n")
