"""Shared fixtures: the `dcp` binary (for independent answers from the command line) and a
generated checkpoint with a tokenizer. ctest passes DCP_BIN and puts the built module on
PYTHONPATH (tests/CMakeLists.txt)."""
import os
import subprocess

import pytest


@pytest.fixture(scope="session")
def dcp_bin():
    path = os.environ.get("DCP_BIN")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("DCP_BIN must name the built dcp binary (ctest sets it)")
    return path


@pytest.fixture(scope="session")
def checkpoint(dcp_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "model"
    subprocess.run([dcp_bin, "gen-checkpoint", "--out", str(out), "--num-layers", "2"], check=True,
                   stdout=subprocess.DEVNULL)
    return str(out)
