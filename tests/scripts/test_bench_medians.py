#!/usr/bin/env python3
"""scripts/bench_medians.py: per-cell medians of repeated runs, labels kept, mismatches refused."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench_medians.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class BenchMedians(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_medians_per_cell_and_labels_kept(self):
        head = "mode,context,dtype,tokens_per_s,roofline_fraction\n"
        a = self.write("a.csv", head + "decode,0,bf16,10,0.5\ndecode,4096,fp8,7,0.9\n")
        b = self.write("b.csv", head + "decode,0,bf16,30,0.7\ndecode,4096,fp8,5,0.8\n")
        c = self.write("c.csv", head + "decode,0,bf16,20,0.6\ndecode,4096,fp8,6.5,1.2\n")
        out = os.path.join(self.dir.name, "out.csv")
        r = run(out, a, b, c)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            self.assertEqual(
                f.read(), head + "decode,0,bf16,20,0.6\ndecode,4096,fp8,6.5,0.9\n")
        # Two runs: the median is the mean of the two.
        r = run(out, a, b)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            self.assertEqual(f.read().splitlines()[1], "decode,0,bf16,20,0.6")

    def test_refuses_runs_that_do_not_match(self):
        head = "mode,dtype,ms\n"
        a = self.write("a.csv", head + "decode,bf16,1\n")
        other_label = self.write("b.csv", head + "decode,fp8,2\n")
        fewer_rows = self.write("c.csv", head)
        other_columns = self.write("d.csv", "mode,dtype,us\ndecode,bf16,1\n")
        out = os.path.join(self.dir.name, "out.csv")
        for bad, words in [(other_label, "runs disagree on a label"),
                           (fewer_rows, "0 rows"),
                           (other_columns, "its columns differ")]:
            r = run(out, a, bad)
            self.assertEqual(r.returncode, 1, bad)
            self.assertIn(words, r.stderr)
        r = run(out, a)
        self.assertEqual(r.returncode, 1)
        self.assertIn("at least two runs", r.stderr)


if __name__ == "__main__":
    unittest.main()
