"""Layout functions against brute force over every position, and topology against the command
line's `dcp topology --json` and its errors."""
import json
import subprocess

import numpy as np
import pytest

import dcp


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("interleave", [1, 2, 16])
def test_layout_against_brute_force(n, interleave):
    positions = np.arange(300)
    # Brute force: deal blocks of `interleave` positions to ranks in turn, rows in arrival order.
    owners, rows, seen = [], [], [0] * n
    for p in positions:
        r = (p // interleave) % n
        owners.append(r)
        rows.append(seen[r])
        seen[r] += 1
    assert list(dcp.owner(positions, n, interleave)) == owners
    assert list(dcp.row(positions, n, interleave)) == rows
    for r in range(n):
        counts = [sum(1 for p in range(x) if owners[p] == r) for x in range(0, 300, 7)]
        assert list(dcp.local_count(np.arange(0, 300, 7), r, n, interleave)) == counts
        mine = [p for p in positions if owners[p] == r]
        assert list(dcp.position(np.arange(len(mine)), r, n, interleave)) == mine
        for start, length in [(0, 0), (5, 1), (3, 40), (17, 100)]:
            first, count = dcp.chunk_share(start, length, r, n, interleave)
            in_chunk = [p for p in mine if start <= p < start + length]
            assert count == len(in_chunk)
            if in_chunk:
                assert first == rows[in_chunk[0]]


def test_layout_scalars_stay_scalars_and_shapes_are_kept():
    assert dcp.owner(7, 3) == 1 and isinstance(dcp.owner(7, 3), int)
    assert dcp.row(np.arange(12).reshape(3, 4), 4).shape == (3, 4)


@pytest.mark.parametrize("call,message", [
    (lambda: dcp.owner(5, 0), "n = 0 must be >= 1"),
    (lambda: dcp.owner(-1, 2), "p must be >= 0"),
    (lambda: dcp.row(3, 2, interleave=0), "interleave = 0 must be >= 1"),
    (lambda: dcp.local_count(10, 2, 2), "r = 2 must be in [0, n = 2)"),
    (lambda: dcp.owner(np.array([1.5]), 2), "positions must be integers"),
    # Sizes of the wrong kind are refused, not truncated or parsed.
    (lambda: dcp.owner(5, 2.7), "n = 2.7 must be an integer"),
    (lambda: dcp.position(3, "1", 2), "r = '1' must be an integer"),
    (lambda: dcp.row(3, 2, interleave=True), "interleave = True must be an integer"),
])
def test_layout_errors(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value)


@pytest.mark.parametrize("config", [
    dict(tp_size=8, dcp_size=4),
    dict(tp_size=8, dcp_size=2, dp_size=2, enable_dp_attention=True),
    dict(tp_size=4, dcp_size=2, dp_size=3),
    dict(tp_size=16, dcp_size=8, dcp_comm_backend="a2a", replicate_q_proj=True),
    dict(tp_size=4, dcp_size=4, dcp_comm_backend="ag_rs"),
])
def test_topology_equals_command_line(dcp_bin, config):
    flags = ["--tp-size", str(config["tp_size"]), "--dcp-size", str(config["dcp_size"])]
    if "dp_size" in config:
        flags += ["--dp-size", str(config["dp_size"])]
    if config.get("enable_dp_attention"):
        flags.append("--enable-dp-attention")
    if "dcp_comm_backend" in config:
        flags += ["--dcp-comm-backend", config["dcp_comm_backend"]]
    if config.get("replicate_q_proj"):
        flags.append("--dcp-replicate-q-proj")
    cli = subprocess.run([dcp_bin, "topology", "--json", *flags], check=True, capture_output=True,
                         text=True)
    assert dcp.topology(**config) == json.loads(cli.stdout)


def test_topology_groups():
    t = dcp.topology(8, 2, dp_size=2, enable_dp_attention=True)
    assert t["attn_tp_size"] == 4 and t["num_dcp_groups"] == 4
    assert t["dcp_groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("config,message", [
    (dict(tp_size=4, dcp_size=3), "legal dcp_size values: 1, 2, 4"),
    (dict(tp_size=8, dcp_size=8, dp_size=2, enable_dp_attention=True), "dcp_size"),
    (dict(tp_size=4, dcp_size=2, dcp_comm_backend="nccl"), "ag_rs"),
    (dict(tp_size=4, dcp_size=2, platform="tpu"), "blackwell-mnnvl"),
    (dict(tp_size=0, dcp_size=1), "tp_size"),
    (dict(tp_size=4.0, dcp_size=2), "tp_size = 4.0 must be an integer"),
    (dict(tp_size=4, dcp_size=2, dp_size=2, enable_dp_attention="no"),
     "enable_dp_attention = 'no' must be True or False"),
    (dict(tp_size=4, dcp_size=2, dcp_comm_backend="ag_rs", replicate_q_proj=True),
     "replicate_q_proj needs an all-to-all combine"),
])
def test_topology_errors_name_the_legal_values(config, message):
    with pytest.raises(ValueError) as e:
        dcp.topology(**config)
    assert message in str(e.value)


def test_version_is_the_command_lines(dcp_bin):
    cli = subprocess.run([dcp_bin, "--version"], check=True, capture_output=True, text=True)
    assert dcp.__version__ == cli.stdout.strip() and dcp.__version__.count(".") == 2
