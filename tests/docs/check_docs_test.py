#!/usr/bin/env python3
"""The docs check catches what it exists to catch: each test plants one fault in a copy of README.md
and docs/ (the rest of the tree linked in as it is) and expects tools/check_docs to fail, naming it;
the unchanged copy must pass.

  check_docs_test.py SOURCE_ROOT BUILD_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE, BUILD = (os.path.abspath(p) for p in sys.argv[1:3])
del sys.argv[1:3]


class PlantedFaults(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="loom-docs-")
        for entry in os.listdir(SOURCE):
            if entry in ("README.md", "docs", ".git") or entry.startswith("build"):
                continue
            os.symlink(os.path.join(SOURCE, entry), os.path.join(self.tmp, entry))
        shutil.copy(os.path.join(SOURCE, "README.md"), self.tmp)
        shutil.copytree(os.path.join(SOURCE, "docs"), os.path.join(self.tmp, "docs"))

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def check(self, build=BUILD):
        out = subprocess.run([sys.executable, os.path.join(SOURCE, "tools", "check_docs"), "--root", self.tmp,
                              "--build", build], capture_output=True, text=True, timeout=240)
        return out.returncode, out.stdout + out.stderr

    def edit(self, rel, change):
        path = os.path.join(self.tmp, rel)
        with open(path) as f:
            text = f.read()
        new = change(text)
        self.assertNotEqual(new, text, f"the planted fault did not change {rel}")
        with open(path, "w") as f:
            f.write(new)

    def assertFails(self, *needles):
        code, out = self.check()
        self.assertEqual(code, 1, out)
        for n in needles:
            self.assertIn(n, out)

    def test_the_docs_as_committed_pass(self):
        code, out = self.check()
        self.assertEqual(code, 0, out)

    def test_a_broken_link(self):
        self.edit("docs/faults.md", lambda t: t + "\nSee [the old page](old_faults.md).\n")
        self.assertFails("docs/faults.md:", "broken link old_faults.md")

    def test_a_link_to_a_section_that_is_not_there(self):
        self.edit("README.md", lambda t: t + "\nSee [settings](docs/settings.md#no-such-section).\n")
        self.assertFails("has no section #no-such-section")

    def test_an_undocumented_setting(self):
        # What a new LOOM_PARAM without a regenerated docs/settings.md looks like to the check.
        self.edit("docs/settings.md", lambda t: re.sub(r"^\| `LOOM_TCP_LOWAT` \|.*\n", "", t, flags=re.M))
        self.assertFails("undocumented: LOOM_TCP_LOWAT")

    def test_a_hand_edited_setting(self):
        self.edit("docs/settings.md", lambda t: t.replace("| `LOOM_TIMEOUT` | `300` |", "| `LOOM_TIMEOUT` | `600` |"))
        self.assertFails("defaults or meanings differ")

    def test_a_setting_that_does_not_exist(self):
        name = "LOOM_" + "TCP_GBPS"  # spelt apart: the check reads this file too, for the names code uses
        self.edit("docs/performance.md", lambda t: t + f"\nSet `{name}=10` for a faster network.\n")
        self.assertFails(f"{name} is not a setting")

    def test_a_program_that_does_not_exist(self):
        self.edit("docs/multinode.md", lambda t: t + "\n```sh\nbuild/bench/allreduce_perf -b 8 -e 1G\n```\n")
        self.assertFails("names build/bench/allreduce_perf, which does not exist")

    def test_a_program_built_only_in_another_configuration(self):
        # CI's machine has no nvcc, so build/bench/cuda_kernels_bench is absent there; docs/gpu.md
        # names it and must still pass, from a build folder that lacks it.
        build = os.path.join(self.tmp, "build-without-cuda")
        os.mkdir(build)
        for entry in os.listdir(BUILD):
            if entry != "bench":
                os.symlink(os.path.join(BUILD, entry), os.path.join(build, entry))
        os.mkdir(os.path.join(build, "bench"))
        for entry in os.listdir(os.path.join(BUILD, "bench")):
            if entry != "cuda_kernels_bench":
                os.symlink(os.path.join(BUILD, "bench", entry), os.path.join(build, "bench", entry))
        code, out = self.check(build)
        self.assertEqual(code, 0, out)

    def test_a_hand_edited_results_table(self):
        def change(t):
            block = re.search(r"<!-- report:readme-allreduce -->\n(.*?)<!-- /report", t, re.S).group(1)
            edited = re.sub(r"\d+\.\d+×", "9.99×", block, count=1)
            return t.replace(block, edited)
        self.edit("README.md", change)
        self.assertFails("differ from what docs/results/ renders")

    def test_a_dated_dump_in_docs(self):
        with open(os.path.join(self.tmp, "docs", "compare_tcp_2026-11-25f.txt"), "w") as f:
            f.write("old figures\n")
        self.assertFails("docs/compare_tcp_2026-11-25f.txt: docs/ holds the manual's .md pages")

    def test_a_front_page_over_300_lines(self):
        self.edit("README.md", lambda t: t + "\n" * 300)
        self.assertFails("the front page stays within 300")


if __name__ == "__main__":
    unittest.main(verbosity=2)
