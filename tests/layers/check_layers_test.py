#!/usr/bin/env python3
"""The layering check catches what it exists to catch: each test plants one fault in a copy of src/
and docs/architecture.md and expects tools/check_layers to fail, naming it; the unchanged copy
must pass.

  check_layers_test.py SOURCE_ROOT
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.abspath(sys.argv[1])
del sys.argv[1]
CHECK = os.path.join(SOURCE, "tools", "check_layers")


class PlantedFaults(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="loom-layers-")
        shutil.copytree(os.path.join(SOURCE, "src"), os.path.join(self.tmp, "src"))
        os.mkdir(os.path.join(self.tmp, "docs"))
        shutil.copy(os.path.join(SOURCE, "docs", "architecture.md"), os.path.join(self.tmp, "docs"))

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def check(self):
        out = subprocess.run([sys.executable, CHECK, "--root", self.tmp], capture_output=True, text=True, timeout=60)
        return out.returncode, out.stdout + out.stderr

    def plant(self, rel, line_after, new_line):
        path = os.path.join(self.tmp, rel)
        with open(path) as f:
            lines = f.read().split("\n")
        at = next(i for i, line in enumerate(lines) if line.startswith(line_after))
        lines.insert(at + 1, new_line)
        with open(path, "w") as f:
            f.write("\n".join(lines))
        return at + 2  # the planted line's number

    def assertFails(self, *needles):
        code, out = self.check()
        self.assertEqual(code, 1, out)
        for n in needles:
            self.assertIn(n, out)

    def test_the_tree_as_committed_passes(self):
        code, out = self.check()
        self.assertEqual(code, 0, out)

    def test_an_algorithm_that_includes_the_communicator(self):
        line = self.plant("src/collectives/ring.cc", "#include", '#include "comm/comm_impl.hpp"')
        self.assertFails(f"src/collectives/ring.cc:{line}: includes comm/", "above its own layer (collectives)")

    def test_the_ground_floor_that_includes_a_transport(self):
        line = self.plant("src/core/request.cc", "#include", '#include "transport/transport.hpp"')
        self.assertFails(f"src/core/request.cc:{line}: includes transport/")

    def test_a_transport_that_includes_an_algorithm(self):
        line = self.plant("src/transport/tcp/tcp_transport.cc", "#include", '#include "collectives/context.hpp"')
        self.assertFails(f"src/transport/tcp/tcp_transport.cc:{line}: includes collectives/")

    def test_a_folder_the_layers_do_not_place(self):
        os.mkdir(os.path.join(self.tmp, "src", "plugins"))
        with open(os.path.join(self.tmp, "src", "plugins", "x.cc"), "w") as f:
            f.write('#include "comm/comm_impl.hpp"\n')
        self.assertFails("src/plugins/: a folder docs/architecture.md's layers block does not place")

    def test_a_layer_that_does_not_exist(self):
        shutil.rmtree(os.path.join(self.tmp, "src", "ddp"))
        self.assertFails("names src/ddp/, which does not exist")

    def test_a_file_over_600_lines(self):
        with open(os.path.join(self.tmp, "src", "comm", "long.cc"), "a") as f:
            f.write("// one line\n" * 601)
        self.assertFails("src/comm/long.cc: 601 lines, over 600")

    def test_includes_that_point_down_pass(self):
        self.plant("src/comm/comm_impl.cc", "#include", '#include "net/socket.hpp"')
        self.plant("src/transport/registry.cc", "#include", '#include "core/status.hpp"')
        code, out = self.check()
        self.assertEqual(code, 0, out)

    def write(self, rel, text):
        with open(os.path.join(self.tmp, rel), "w") as f:
            f.write(text)

    def test_a_communicator_file_in_the_algorithms_namespace(self):
        self.write("src/comm/planted.cc", "namespace loom {\nnamespace coll {\nint planted = 0;\n}  // namespace coll\n"
                   "}  // namespace loom\n")
        self.assertFails("src/comm/planted.cc:2: defines in namespace loom::coll, which belongs to another folder")

    def test_an_algorithm_outside_its_folders_namespace(self):
        self.write("src/collectives/planted.cc", "namespace loom {\nnamespace {\nint planted = 0;\n}  // namespace\n"
                   "}  // namespace loom\n")
        self.assertFails("src/collectives/planted.cc:2: defines in namespace loom, but src/collectives/ is namespace "
                         "loom::coll")

    def test_a_transport_in_another_transports_namespace(self):
        self.write("src/transport/tcp/planted.hpp", "namespace loom::shm {\nstruct Planted {};\n}  // namespace loom::shm\n")
        self.assertFails("src/transport/tcp/planted.hpp:1: defines in namespace loom::shm, but src/transport/tcp/ is "
                         "namespace loom::tcp")

    def test_forward_declarations_may_name_any_namespace(self):
        self.write("src/comm/planted.hpp", "namespace loom {\nnamespace coll {\nclass Selector;\nstruct Args;\n"
                   "}  // namespace coll\nnamespace device {\nclass DeviceRuntime;\n}  // namespace device\n"
                   "}  // namespace loom\n")
        code, out = self.check()
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
