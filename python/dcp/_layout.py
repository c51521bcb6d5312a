"""Token ownership in a DCP group and topology resolution.

With N ranks and interleave I, position p belongs to rank owner(p) = (p // I) % N and sits at
local row row(p) = (p // (I*N)) * I + p % I there. Every function takes ints or int arrays
(any shape) and returns the same kind.
"""
import json

import numpy as np

from . import _dcp
from ._numbers import boolean, integer


def _vectorised(fn, x, *args):
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"positions must be integers, got dtype {arr.dtype}")
    out = fn(arr.astype(np.int64, copy=False), *args)
    return int(out) if arr.ndim == 0 else out


def owner(p, n, interleave=1):
    """The DCP rank that stores position p."""
    return _vectorised(_dcp._owner, p, integer(n, "n"), integer(interleave, "interleave"))


def row(p, n, interleave=1):
    """Position p's local row on its owner."""
    return _vectorised(_dcp._row, p, integer(n, "n"), integer(interleave, "interleave"))


def local_count(x, r, n, interleave=1):
    """How many positions of [0, x) rank r stores: its local length of a sequence of length x."""
    return _vectorised(_dcp._local_count, x, integer(r, "r"), integer(n, "n"),
                       integer(interleave, "interleave"))


def position(local_row, r, n, interleave=1):
    """The global position of rank r's local row (the inverse of row)."""
    return _vectorised(_dcp._position, local_row, integer(r, "r"), integer(n, "n"),
                       integer(interleave, "interleave"))


def chunk_share(start, length, r, n, interleave=1):
    """Rank r's share of the chunk [start, start + length): (first local row, row count)."""
    start = np.asarray(start)
    length = np.asarray(length)
    if np.any(length < 0):
        raise ValueError("length must be >= 0")
    first = local_count(start, r, n, interleave)
    rows = local_count(start + length, r, n, interleave) - first
    return first, rows


def topology(tp_size, dcp_size=1, dp_size=1, enable_dp_attention=False, pcp_size=1,
             dcp_comm_backend=None, replicate_q_proj=False, platform="cpu"):
    """The resolved configuration and its rank groups (the object `dcp topology --json` prints).

    Raises ValueError naming the argument and its legal values for an invalid configuration.
    """
    text = _dcp._topology_json(integer(tp_size, "tp_size"), integer(dcp_size, "dcp_size"),
                               integer(dp_size, "dp_size"),
                               boolean(enable_dp_attention, "enable_dp_attention"),
                               integer(pcp_size, "pcp_size"), dcp_comm_backend,
                               boolean(replicate_q_proj, "replicate_q_proj"), str(platform))
    return json.loads(text)
