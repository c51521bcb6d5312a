#!/usr/bin/python3
"""dcp.mla_decode called from Python against the same kernel timed in a C++ loop (the overhead of
a Python call), and against PyTorch's own bf16 attention on the same shapes, all in one run.

Usage: PYTHONPATH=build/release/python python/bench/bench_mla_decode.py [--context 4096]
       [--heads 1,16,128] [--repeats 50] [--csv FILE]
One thread everywhere (torch.set_num_threads(1), num_threads=1). The cache is bf16, 576 wide
(DeepSeek's 512 + 64), one request, decode (one query token). Python and C++ times are the
fastest of their repeats (the overhead is a difference of two times on a shared machine: the
minimum is the stable estimate); torch's is the median.
"""
import argparse
import csv
import statistics
import sys
import time

import numpy as np
import torch

import dcp


def median_seconds(fn, repeats):
    fn()  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fastest_seconds(fn, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--heads", default="1,16,128")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--csv")
    a = ap.parse_args()
    if a.context < 1 or a.repeats < 1:
        sys.exit("--context and --repeats must be >= 1")
    torch.set_num_threads(1)
    page, width, rank = 64, 576, 512
    scale = 1 / (192 ** 0.5)
    rng = np.random.default_rng(0)
    pages = -(-a.context // page)
    kv = torch.from_numpy(rng.standard_normal((pages, page, width), dtype=np.float32))
    kv = kv.to(torch.bfloat16)
    table = np.arange(pages, dtype=np.int32)[None, :]
    seq = np.array([a.context], dtype=np.int64)
    k = kv.reshape(1, -1, width)[:, :a.context]  # [1, S, 576] for torch
    v = k[:, :, :rank]
    rows = []
    print(f"context {a.context}, bf16 KV, one thread, torch {torch.__version__}, "
          f"kernel paths {dcp.kernel_paths()}")
    print(f"{'heads':>5} {'python us':>10} {'c++ loop us':>12} {'overhead us':>12} "
          f"{'torch bf16 us':>14} {'torch / dcp':>12}")
    for heads in (int(h) for h in a.heads.split(",")):
        q = rng.standard_normal((1, heads, width)).astype(np.float32)
        py = fastest_seconds(lambda: dcp.mla_decode(q, kv, table, seq, scale=scale), a.repeats)
        args = dcp._dcp._decode_args(q, dcp.as_kernel_array(kv, "kv"), table, seq, None, scale,
                                     rank, 1, 0, 1, True, 0, 0.0, None, None, 1, "automatic")
        cxx = min(dcp._dcp._time_mla_decode(args, 1) for _ in range(a.repeats))
        qt = torch.from_numpy(q).to(torch.bfloat16)

        def torch_attention():
            s = torch.bmm(qt, k.transpose(1, 2)) * scale
            return torch.bmm(torch.softmax(s.float(), dim=-1).to(torch.bfloat16), v)

        tt = median_seconds(torch_attention, a.repeats)
        rows.append(dict(heads=heads, context=a.context, python_us=py * 1e6, cxx_loop_us=cxx * 1e6,
                         overhead_us=(py - cxx) * 1e6, torch_bf16_us=tt * 1e6,
                         torch_over_dcp=tt / py))
        r = rows[-1]
        print(f"{heads:>5} {r['python_us']:>10.1f} {r['cxx_loop_us']:>12.1f} "
              f"{r['overhead_us']:>12.1f} {r['torch_bf16_us']:>14.1f} {r['torch_over_dcp']:>12.2f}")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
