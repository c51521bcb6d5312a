#!/usr/bin/env python3
"""PyTorch peer for `dcp bench attention`: absorbed MLA decode as matmul, softmax, matmul.

The benchmark runs this once per (batch, context, heads) point, in the same run as the kernel it
is compared with. Every buffer (query, KV, scores, output) is allocated once, before the timed
loop; each timed call is three ops writing into those buffers:

    S = scale * Q K^T     (baddbmm, beta 0)     Q: [B, Hq, 576], K: [B, S, 576]
    P = softmax(S)        (in place)
    O = P V               (bmm)                 V: the first 512 columns of K, a strided view

With FLUSH_BYTES > 0, every timed call follows an untimed read of a buffer that large (the
benchmark passes twice the last-level cache), so that the call finds the KV in memory, not in
cache, as the benchmark's own calls do.

Usage: torch_peer.py BATCH CONTEXT HEADS THREADS REPEATS DTYPE[,DTYPE...] FLUSH_BYTES
       torch_peer.py --version
Prints one line per dtype: "<dtype> <median ms>" (or "torch <version>"). Exits 3 if torch
cannot be imported, so the caller can report the peer as not measured.
"""
import os
import statistics
import sys
import time


def main() -> int:
    if sys.argv[1:] == ["--version"]:
        try:
            import torch
        except ImportError as e:
            print(f"torch unavailable: {e}", file=sys.stderr)
            return 3
        print(f"torch {torch.__version__}")
        return 0
    if len(sys.argv) != 8:
        print(__doc__, file=sys.stderr)
        return 2
    batch, context, heads, threads, repeats = (int(a) for a in sys.argv[1:6])
    dtypes = sys.argv[6].split(",")
    flush_bytes = int(sys.argv[7])
    # BLAS under torch keeps its own thread pool; pin it to the same count before import.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    try:
        import torch
    except ImportError as e:
        print(f"torch unavailable: {e}", file=sys.stderr)
        return 3
    torch.set_num_threads(threads)
    torch.manual_seed(7)
    flush = torch.ones(flush_bytes // 4, dtype=torch.float32) if flush_bytes > 0 else None
    names = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for name in dtypes:
        if name not in names:
            print(f"unknown dtype '{name}': legal values are fp32, bf16", file=sys.stderr)
            return 2
        dt = names[name]
        q = torch.randn(batch, heads, 576, dtype=dt)
        kv = torch.randn(batch, context, 576, dtype=dt)
        k_t = kv.transpose(1, 2)
        v = kv[:, :, :512]
        s = torch.empty(batch, heads, context, dtype=dt)
        o = torch.empty(batch, heads, 512, dtype=dt)

        def step():
            torch.baddbmm(s, q, k_t, beta=0.0, alpha=0.07, out=s)
            torch.softmax(s, dim=-1, out=s)
            torch.bmm(s, v, out=o)

        step()  # warm-up: first-call dispatch and primitive creation stay out of the timing
        times = []
        for _ in range(repeats):
            if flush is not None:
                flush.sum()
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        print(f"{name} {statistics.median(times):.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
