"""Inter-token latency of a stream while long prompts arrive, undivided against disaggregated.

For each layout named (tp1: TP 1; tp2dcp2: TP 2 x DCP 2), starts `dcp serve` undivided and with
`--disaggregate` (one prefill rank after it), streams a 120-token greedy request, and 0.3 s into
it sends four 1500-token prompts 0.2 s apart. Prints the stream's inter-token gaps (p50, p95,
max) and the long prompts' time to first token. Model: deepseek-v2-lite cut to 2 layers,
512-token prefill chunks. Each pair runs twice, alternating, so a noisy host shows.

    /usr/bin/python3 scripts/serve_itl.py build/release/tools/dcp tp1 tp2dcp2
"""
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time

DCP = sys.argv[1]
LAYOUTS = {"tp1": ["--tp-size", "1", "--dcp-size", "1"], "tp2dcp2": ["--tp-size", "2", "--dcp-size", "2"]}
BASE = ["--preset", "deepseek-v2-lite", "--num-layers", "2", "--max-total-tokens", "16384",
        "--chunked-prefill-size", "512"]


def start(flags):
    p = subprocess.Popen([DCP, "serve", "--port", "0", *flags], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    m = re.search(r":(\d+) \(", line)
    if not m:
        raise SystemExit("the server did not start: " + line)
    return p, int(m.group(1))


def stream(port, prompt, max_new, arrivals, first=None):
    """Streams one greedy request; appends each token's arrival time, and the wait for the first."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.monotonic()
    c.request("POST", "/generate", json.dumps({"input_ids": prompt, "stream": True, "sampling_params": {
        "max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}))
    r = c.getresponse()
    times = []
    while True:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: ") and b"[DONE]" not in line:
            times.append(time.monotonic())
    arrivals.extend(times)
    if first is not None and times:
        first.append(times[0] - sent)


def measure(flags):
    p, port = start(flags)
    try:
        stream(port, [5, 6, 7], 4, [])  # warm up
        times, ttft = [], []
        t = threading.Thread(target=stream, args=(port, list(range(1, 200)), 120, times))
        t.start()
        time.sleep(0.3)
        longs = [threading.Thread(target=stream, args=(
            port, [(i * 7 + k) % 500 + 1 for k in range(1500)], 2, [], ttft)) for i in range(4)]
        for x in longs:
            x.start()
            time.sleep(0.2)
        for x in longs:
            x.join()
        t.join()
        gaps = sorted(b - a for a, b in zip(times, times[1:]))
        return (statistics.median(gaps) * 1000, gaps[int(0.95 * len(gaps))] * 1000, gaps[-1] * 1000,
                statistics.mean(ttft), max(ttft))
    finally:
        p.terminate()
        p.wait()


for _ in range(2):
    for name in sys.argv[2:] or ["tp1"]:
        for label, extra in [("undivided " + name, []), ("1 prefill rank + " + name, ["--disaggregate"])]:
            print("%-24s ITL p50 %6.1f ms  p95 %7.1f ms  max %7.1f ms   long prompts TTFT mean %5.2f s  max %5.2f s"
                  % (label, *measure(BASE + LAYOUTS[name] + extra)), flush=True)
