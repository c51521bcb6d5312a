"""Scoring the end of a prompt whose start the prefix cache holds, with /generate's
logprob_start_len near the end against 0 (the whole prompt scored).

Starts `dcp serve` with the prefix cache (deepseek-v2-lite cut to 2 layers), sends a 1024-token
prompt once so that its pages are cached, then scores it four times each way, alternating:
logprob_start_len 0 (every position: the whole prompt computed, logits for each row) and 1000
(the last 24 positions: the cached pages before position 999 reused, logits only from there).
Prints each way's times, the tokens the cache gave, and the ratio of the medians.

    /usr/bin/python3 scripts/serve_scoring.py build/release/tools/dcp
"""
import http.client
import json
import re
import statistics
import subprocess
import sys
import time

DCP = sys.argv[1]
FLAGS = ["--preset", "deepseek-v2-lite", "--num-layers", "2", "--max-total-tokens", "16384",
         "--enable-prefix-cache"]
LENGTH, LATE = 1024, 1000


def main():
    server = subprocess.Popen([DCP, "serve", "--port", "0", *FLAGS], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(re.search(r":(\d+) \(", server.stdout.readline()).group(1))

        def generate(body):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            conn.request("POST", "/generate", json.dumps(body))
            reply = json.loads(conn.getresponse().read())
            conn.close()
            return reply

        prompt = [(7 * k * k + 3 * k + 11) % 500 + 1 for k in range(LENGTH)]
        generate({"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}})  # cached now
        times = {0: [], LATE: []}
        for _ in range(4):
            for start in times:
                t = time.perf_counter()
                r = generate({"input_ids": prompt, "sampling_params": {"max_new_tokens": 1},
                              "return_logprob": True, "logprob_start_len": start})
                times[start].append(time.perf_counter() - t)
                scored = len(r["meta_info"]["input_token_logprobs"])
                assert scored == LENGTH - start, f"start {start}: {scored} positions scored"
                cached = r["meta_info"]["cached_tokens"]
        for start, ts in times.items():
            print(f"logprob_start_len {start:4d}: median {statistics.median(ts) * 1000:6.0f} ms  "
                  f"({', '.join(f'{x * 1000:.0f}' for x in ts)})")
        print(f"cached tokens at logprob_start_len {LATE}: {cached}")
        print(f"whole / late: {statistics.median(times[0]) / statistics.median(times[LATE]):.1f}x")
    finally:
        server.terminate()
        server.wait()


main()
