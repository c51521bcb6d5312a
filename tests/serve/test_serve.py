#!/usr/bin/python3
"""`dcp serve` end to end over HTTP, with the Python standard library as the client.

Usage: test_serve.py path/to/dcp [CASE ...]   (cases: see CASES; default all but mpi)
       test_serve.py path/to/dcp mpi MPIEXEC  (the same server under mpirun, one rank per process)

Starts a server on a generated checkpoint (TP 2, DCP 2, ranks as threads) on a free port and
checks what a client sees: greedy tokens equal to `dcp run`'s, streams equal to whole replies,
seeds, stop strings, logprobs, the errors and their statuses, the queue bound, a client that
goes away mid-stream, the metrics, and a graceful shutdown.
"""
import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

DCP = os.path.abspath(sys.argv[1])
TMP = tempfile.mkdtemp(prefix="dcp_serve_")
CKPT = os.path.join(TMP, "ckpt")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


class Server:
    def __init__(self, *flags, launcher=(), model=None):
        self.log = open(os.path.join(TMP, "server.log"), "w+")
        self.proc = subprocess.Popen([*launcher, DCP, "serve", "--model-path", model or CKPT, "--port", "0", *flags],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not m:
            self.log.seek(0)
            raise RuntimeError("the server did not start: " + line + self.log.read())
        self.port = int(m.group(1))
        self.banner = line

    def request(self, method, path, body=None, raw=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        text = r.read().decode("utf-8", "replace")
        conn.close()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text

    def post(self, path, body):
        return self.request("POST", path, body)

    def stream(self, path, body):
        """The data: events of a streamed reply, parsed (the final [DONE] as the string)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        events = []
        for line in r.read().decode("utf-8").split("\n"):
            if line.startswith("data: "):
                payload = line[6:]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
        conn.close()
        return r.status, r.getheader("Content-Type"), events

    def metrics(self):
        _, text = self.request("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.log.close()
        return self.proc.returncode, out


def run_tokens(prompt, max_new, *flags):
    """What `dcp run` generates for one prompt (greedy)."""
    out = os.path.join(TMP, "run.json")
    subprocess.run([DCP, "run", "--model-path", CKPT, "--prompt-tokens", ",".join(map(str, prompt)),
                    "--max-new-tokens", str(max_new), "--no-verify", "--json", out, *flags],
                   check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        report = json.load(f)
    return report["requests"][0]["output_tokens"]


PROMPT = [5, 77, 300, 12, 9, 41, 250, 3, 199, 7, 64, 18, 402]


def case_greedy_equals_run(s):
    want = run_tokens(PROMPT, 16, "--tp-size", "2", "--dcp-size", "2")
    status, r = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0,
                                           "ignore_eos": True})
    check(status == 200, f"greedy completion: status {status}")
    check(r["choices"][0]["token_ids"] == want, f"greedy tokens {r['choices'][0]['token_ids']} != dcp run {want}")
    check(r["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": 16, "total_tokens": len(PROMPT) + 16,
                         "prompt_tokens_details": {"cached_tokens": 0}}, f"usage {r['usage']}")
    check(r["choices"][0]["finish_reason"] == "length", "finish_reason length")
    status, g = s.post("/generate", {"input_ids": PROMPT, "sampling_params": {
        "max_new_tokens": 16, "temperature": 0, "ignore_eos": True}})
    check(status == 200 and g["output_ids"] == want, f"/generate ids {g}")
    check(g["text"] == r["choices"][0]["text"], "/generate and /v1/completions give the same text")


def case_stream_equals_whole(s):
    for path, body in [("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}),
                       ("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                                              {"role": "user", "content": "Name a color."}],
                                                 "max_tokens": 24, "temperature": 0})]:
        status, whole = s.post(path, body)
        check(status == 200, f"{path}: status {status} {whole}")
        status, ctype, events = s.stream(path, {**body, "stream": True, "stream_options": {"include_usage": True}})
        check(status == 200 and ctype.startswith("text/event-stream"), f"{path} stream: {status} {ctype}")
        check(events and events[-1] == "[DONE]", f"{path}: stream ends with [DONE]")
        chunks = [e for e in events[:-1] if e["choices"]]
        if "chat" in path:
            text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
            check(chunks[0]["choices"][0]["delta"].get("role") == "assistant", "first chat delta has the role")
            want = whole["choices"][0]["message"]["content"]
            check(whole["object"] == "chat.completion" and chunks[0]["object"] == "chat.completion.chunk", "chat objects")
        else:
            text = "".join(c["choices"][0]["text"] for c in chunks)
            want = whole["choices"][0]["text"]
        check(text == want, f"{path}: streamed {text!r} != whole {want!r}")
        check(chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"], f"{path}: finish_reason")
        # How many chunks carry the tokens depends on when the handler wakes (under load it may
        # find them all at once); that they come while the request runs is case_disconnect's.
        least = 2 if "chat" in path else 1  # chat's first chunk names the role alone
        check(least <= len(chunks) <= whole["usage"]["completion_tokens"] + 2,
              f"{path}: {len(chunks)} chunks for {whole['usage']['completion_tokens']} tokens")
        usage = events[-2].get("usage")
        check(usage == whole["usage"], f"{path}: stream usage {usage} != {whole['usage']}")
        check(all("usage" not in c for c in chunks), f"{path}: no usage per chunk unless asked")
        # continuous_usage_stats: every chunk tells the tokens so far, ending at the whole's.
        status, _, events = s.stream(path, {**body, "stream": True, "stream_options": {
            "include_usage": True, "continuous_usage_stats": True}})
        chunks = [e for e in events[:-1] if e["choices"]]
        counts = [c["usage"]["completion_tokens"] for c in chunks]
        check(all(c["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] and
                  c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
                  for c in chunks), f"{path}: per-chunk usage {[c['usage'] for c in chunks]}")
        check(counts == sorted(counts) and counts[-1] == whole["usage"]["completion_tokens"] and counts[0] < counts[-1],
              f"{path}: completion tokens so far {counts}")


def case_prompt_batch(s):
    """A list of prompts in one /v1/completions request: choice prompt x n + j is what the prompt
    alone gives as its choice j, streamed or not; usage counts each prompt once."""
    prompts = ["Once upon a time", "The sea", [5, 6, 7]]
    body = {"max_tokens": 8, "temperature": 1.0, "seed": 11, "n": 2, "ignore_eos": True}
    alone = [s.post("/v1/completions", {**body, "prompt": p})[1] for p in prompts]
    status, r = s.post("/v1/completions", {**body, "prompt": prompts})
    check(status == 200 and [c["index"] for c in r["choices"]] == list(range(6)), f"six choices in order: {r}")
    for k, c in enumerate(r["choices"]):
        want = alone[k // 2]["choices"][k % 2]
        check((c["token_ids"], c["text"]) == (want["token_ids"], want["text"]), f"choice {k} equals its prompt's alone")
    check(r["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone),
          f"prompt tokens counted once per prompt: {r['usage']}")
    check(r["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone), "completion tokens")
    status, ctype, events = s.stream("/v1/completions", {**body, "prompt": prompts, "stream": True})
    texts = [""] * 6
    for e in events[:-1]:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
    check(texts == [c["text"] for c in r["choices"]], f"streamed per index: {texts}")
    ids = s.post("/v1/completions", {**body, "prompt": [[1, 2], [3, 4, 5]], "n": 1})[1]
    check(len(ids["choices"]) == 2 and ids["usage"]["prompt_tokens"] == 5, f"a batch of id lists: {ids}")


def case_seeds(s):
    body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 1.0, "top_p": 0.9, "seed": 7, "ignore_eos": True}
    a = s.post("/v1/completions", body)[1]["choices"][0]["token_ids"]
    b = s.post("/v1/completions", body)[1]["choices"][0]["token_ids"]
    c = s.post("/v1/completions", {**body, "seed": 8})[1]["choices"][0]["token_ids"]
    check(a == b, "same seed, same request: same tokens")
    check(a != c, "another seed: other tokens")
    status, r = s.post("/v1/completions", {**body, "n": 3})
    ids = [ch["token_ids"] for ch in r["choices"]]
    check(status == 200 and [ch["index"] for ch in r["choices"]] == [0, 1, 2], f"n=3: {status}")
    check(ids[0] == a and len({tuple(x) for x in ids}) == 3, "n=3: choice i uses seed + i")
    check(r["usage"]["completion_tokens"] == 60, "n=3 usage counts every choice")
    # /generate takes the seed as SGLang names it too.
    params = {"max_new_tokens": 20, "temperature": 1.0, "top_p": 0.9, "ignore_eos": True}
    status, g = s.post("/generate", {"input_ids": PROMPT, "sampling_params": {**params, "sampling_seed": 7}})
    check(status == 200 and g["output_ids"] == a, f"/generate's sampling_seed is the seed: {g}")


def case_stop_strings(s):
    body = {"prompt": "The quick brown fox", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    full = s.post("/v1/completions", body)[1]["choices"][0]
    text = full["text"]
    # A stop string that spans tokens: characters 6..9 of the text.
    stop = text[6:9]
    check(len(stop) == 3, f"greedy text too short to test stop strings: {text!r}")
    status, r = s.post("/v1/completions", {**body, "stop": [stop]})
    got = r["choices"][0]
    check(got["text"] == text[:text.index(stop)], f"stop {stop!r}: {got['text']!r} vs {text!r}")
    check(got["finish_reason"] == "stop", "a stop string ends with finish_reason stop")
    _, _, events = s.stream("/v1/completions", {**body, "stop": stop, "stream": True})
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1])
    check(streamed == got["text"], f"streamed stop {streamed!r} != {got['text']!r}")
    # vLLM's include_stop_str_in_output, SGLang's no_stop_trim: the text ends after it.
    end = text.index(stop) + len(stop)
    status, r = s.post("/v1/completions", {**body, "stop": [stop], "include_stop_str_in_output": True})
    check(r["choices"][0]["text"] == text[:end], f"stop string kept: {r['choices'][0]['text']!r}")
    _, _, events = s.stream("/v1/completions", {**body, "stop": stop, "stream": True,
                                                "include_stop_str_in_output": True})
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1])
    check(streamed == text[:end], f"streamed with the stop string kept: {streamed!r}")
    status, r = s.post("/generate", {"text": body["prompt"], "sampling_params": {
        "max_new_tokens": 40, "temperature": 0, "ignore_eos": True, "stop": stop, "no_stop_trim": True}})
    check(r["text"] == text[:end], f"/generate's no_stop_trim: {r['text']!r}")
    # A stop token id: the text ends with that token, finish_reason stop.
    ids = full["token_ids"]
    status, r = s.post("/v1/completions", {**body, "stop_token_ids": [ids[5]]})
    check(r["choices"][0]["token_ids"] == ids[:ids.index(ids[5]) + 1], "stop_token_ids end after that token")
    check(r["choices"][0]["finish_reason"] == "stop", "stop token: finish_reason stop")


def case_penalties(s):
    """logit_bias and the penalties, with outcomes known without the model: a bias of 100 makes
    its token the greedy choice; a huge repetition penalty then forbids it once emitted."""
    body = {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    status, r = s.post("/v1/completions", {**body, "logit_bias": {"7": 100}})
    check(status == 200 and r["choices"][0]["token_ids"] == [7] * 4, f"a bias of 100 picks token 7 each step: {r}")
    status, r = s.post("/v1/completions", {**body, "logit_bias": {"7": 100}, "repetition_penalty": 1e6})
    ids = r["choices"][0]["token_ids"] if status == 200 else []
    check(ids[:1] == [7] and 7 not in ids[1:], f"the repetition penalty forbids 7 once emitted: {r}")
    status, r = s.post("/v1/completions", {**body, "logit_bias": {"7": 100}, "frequency_penalty": 2,
                                           "presence_penalty": 2})
    check(status == 200 and r["choices"][0]["token_ids"] == [7] * 4, f"penalties of 4 do not outweigh 100: {r}")
    status, r = s.post("/generate", {"input_ids": [1, 2, 3], "sampling_params": {
        "max_new_tokens": 3, "temperature": 0, "ignore_eos": True, "logit_bias": {"9": 100}}})
    check(status == 200 and r["output_ids"] == [9] * 3, f"/generate honours logit_bias: {r}")
    status, r = s.post("/v1/completions", body)
    first = r["choices"][0]["token_ids"][0]
    status, r = s.post("/v1/completions", {**body, "logit_bias": {str(first): -100, "8": 0}})
    check(status == 200 and first not in r["choices"][0]["token_ids"], f"a bias of -100 forbids {first}: {r}")


def case_masks(s):
    """allowed_token_ids, bad_words and truncate_prompt_tokens, each checked against what it must
    leave out or keep."""
    body = {"prompt": [6, 7, 8, 9], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    status, r = s.post("/v1/completions", {**body, "allowed_token_ids": [5, 9, 400]})
    ids = r["choices"][0]["token_ids"] if status == 200 else []
    check(len(ids) == 6 and set(ids) <= {5, 9, 400}, f"allowed_token_ids: only those: {r}")
    status, r = s.post("/generate", {"input_ids": [6, 7, 8, 9], "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "allowed_token_ids": [11]}})
    check(status == 200 and r["output_ids"] == [11] * 4, f"/generate's allowed_token_ids: {r}")
    # A word the model emits, banned: its token never comes again, at the start or after a space.
    text_body = {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                 "logprobs": 0}
    status, r = s.post("/v1/completions", text_body)
    plain = r["choices"][0]
    words = [(t, i) for i, t in zip(plain["token_ids"], plain["logprobs"]["tokens"])
             if t.strip() and t.strip().isascii() and t.strip().isprintable()]
    check(words, f"the greedy text has a token with a printable word to ban: {plain}")
    word, banned = words[0]
    status, r = s.post("/v1/completions", {**text_body, "bad_words": [word.strip()]})
    ids = r["choices"][0]["token_ids"] if status == 200 else []
    check(len(ids) == 16 and banned not in ids and ids != plain["token_ids"],
          f"bad_words [{word.strip()!r}] bans token {banned}: {ids} (plain {plain['token_ids']})")
    # guided_choice: the reply is one of the choices, whole, streamed, sampled, in a chat.
    colors = ["red", "green", "dark blue", "blue-green"]
    status, r = s.post("/v1/completions", {**body, "max_tokens": 16, "guided_choice": colors})
    check(status == 200 and r["choices"][0]["text"] in colors and r["choices"][0]["finish_reason"] == "stop",
          f"guided_choice: one of {colors}: {r}")
    status, _, events = s.stream("/v1/completions", {**body, "max_tokens": 16, "guided_choice": colors, "stream": True})
    check("".join(e["choices"][0]["text"] for e in events[:-1]) == r["choices"][0]["text"], f"streamed: {events}")
    status, r = s.post("/v1/completions", {**body, "max_tokens": 16, "guided_choice": colors, "temperature": 1,
                                           "seed": 5, "n": 8})
    texts = [c["text"] for c in r["choices"]] if status == 200 else []
    check(len(texts) == 8 and set(texts) <= set(colors) and len(set(texts)) > 1, f"sampled choices: {texts}")
    status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a color."}],
                                                "max_tokens": 16, "temperature": 0, "guided_choice": colors})
    check(status == 200 and r["choices"][0]["message"]["content"] in colors, f"chat guided_choice: {r}")
    status, r = s.post("/v1/completions", {**body, "max_tokens": 2, "guided_choice": ["dark blue", "dark red"]})
    check(status == 200 and r["choices"][0]["finish_reason"] == "length" and
          len(r["choices"][0]["token_ids"]) == 2 and "dark ".startswith(r["choices"][0]["text"]),
          f"a choice longer than max_tokens is cut, finish_reason length: {r}")
    # truncate_prompt_tokens keeps the last k tokens: the same completion as that prompt alone.
    status, r = s.post("/v1/completions", {**body, "prompt": PROMPT, "truncate_prompt_tokens": 4, "echo": True})
    status2, r2 = s.post("/v1/completions", {**body, "prompt": PROMPT[-4:], "echo": True})
    check(status == 200 and r["choices"][0]["token_ids"] == r2["choices"][0]["token_ids"]
          and r["usage"]["prompt_tokens"] == 4 and r["choices"][0]["text"] == r2["choices"][0]["text"],
          f"truncate_prompt_tokens 4: {r} vs {r2}")
    status, r = s.post("/v1/completions", {**body, "prompt": [1, 2], "truncate_prompt_tokens": -1})
    check(status == 200 and r["usage"]["prompt_tokens"] == 2, f"truncate_prompt_tokens -1 keeps a short prompt: {r}")


def case_guided_regex(s):
    """guided_regex (and SGLang's regex): the reply's text matches the pattern whole (Python's re
    decides), whole, streamed, sampled, in a chat and on /generate; cut by max_tokens, a prefix."""
    body = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 32}
    pattern = r"\d{3}-[a-z]{2,4}( ok)?"
    status, r = s.post("/v1/completions", {**body, "guided_regex": pattern})
    c = r["choices"][0] if status == 200 else {}
    check(status == 200 and re.fullmatch(pattern, c["text"]) and c["finish_reason"] == "stop",
          f"guided_regex {pattern!r}: {r}")
    status, _, events = s.stream("/v1/completions", {**body, "guided_regex": pattern, "stream": True})
    check("".join(e["choices"][0]["text"] for e in events[:-1]) == c.get("text"), f"streamed: {events}")
    status, r = s.post("/v1/completions", {**body, "guided_regex": pattern, "temperature": 1, "seed": 3, "n": 6})
    texts = [x["text"] for x in r["choices"]] if status == 200 else []
    check(len(texts) == 6 and all(re.fullmatch(pattern, t) for t in texts) and len(set(texts)) > 1,
          f"sampled: {texts}")
    status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Yes or no?"}],
                                                "max_tokens": 8, "temperature": 0, "guided_regex": "(yes|no)!?"})
    check(status == 200 and re.fullmatch("(yes|no)!?", r["choices"][0]["message"]["content"]), f"chat: {r}")
    status, r = s.post("/generate", {"text": "Once upon a time", "sampling_params": {
        "max_new_tokens": 16, "temperature": 0, "regex": "[A-Z][a-z]{1,3} [0-9]{2}"}})
    check(status == 200 and re.fullmatch("[A-Z][a-z]{1,3} [0-9]{2}", r["text"]), f"/generate regex: {r}")
    # Non-ASCII classes and '.', and a match that may go on: max_tokens cuts it, a prefix stays.
    status, r = s.post("/v1/completions", {**body, "guided_regex": "[à-ü]+.", "ignore_eos": True,
                                           "max_tokens": 4})
    c = r["choices"][0] if status == 200 else {}
    check(status == 200 and (re.fullmatch("[à-ü]+.", c["text"]) if c["finish_reason"] == "stop" else
                             c["finish_reason"] == "length" and len(c["token_ids"]) == 4
                             and re.fullmatch("[à-ü]*", c["text"].rstrip("\ufffd"))), f"a cut match: {r}")


def bracket_list(text):
    """'whole', 'prefix' or None: whether text is a list of the guided_grammar case's grammar
    (root ::= "[" (item ("," item)*)? "]", item ::= [a-z]+ | root), a prefix of one, or neither."""
    depth, prev = 0, ""
    for i, ch in enumerate(text):
        if ch == "[":
            if i and prev not in "[,":
                return None
            depth += 1
        elif ch == "]":
            if depth == 0 or prev == ",":
                return None
            depth -= 1
            if depth == 0 and i != len(text) - 1:
                return None
        elif ch == ",":
            if depth == 0 or prev in "[,":
                return None
        elif "a" <= ch <= "z":
            if depth == 0 or prev == "]":
                return None
        else:
            return None
        prev = ch
    if not text:
        return "prefix"
    return "whole" if depth == 0 else "prefix"


def case_guided_grammar(s):
    """guided_grammar (vLLM's), ebnf (SGLang's) and structured_outputs.grammar: the reply is a
    whole text of the GBNF grammar (Python's re decides a regular one, a bracket counter nested
    lists), whole, streamed, sampled, in a chat and on /generate; refusals name the field."""
    body = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 32}
    grammar = 'root ::= answer " " num\nanswer ::= "yes" | "no"  # a comment\nnum ::= [1-9] [0-9]{0,2}'
    pattern = r"(yes|no) [1-9][0-9]{0,2}"
    status, r = s.post("/v1/completions", {**body, "guided_grammar": grammar})
    c = r["choices"][0] if status == 200 else {}
    check(status == 200 and re.fullmatch(pattern, c["text"]) and c["finish_reason"] == "stop",
          f"guided_grammar: {r}")
    status, _, events = s.stream("/v1/completions", {**body, "guided_grammar": grammar, "stream": True})
    check("".join(e["choices"][0]["text"] for e in events[:-1]) == c.get("text"), f"streamed: {events}")
    for other in [{"structured_outputs": {"grammar": grammar}}, {"ebnf": grammar}]:
        status, r2 = s.post("/v1/completions", {**body, **other})
        check(status == 200 and r2["choices"][0]["text"] == c.get("text"), f"{other}: {r2}")
    status, r = s.post("/generate", {"text": "Once upon a time", "sampling_params": {
        "max_new_tokens": 16, "temperature": 0, "ebnf": grammar}})
    check(status == 200 and re.fullmatch(pattern, r["text"]), f"/generate ebnf: {r}")
    status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Yes or no?"}],
                                                "max_tokens": 8, "temperature": 0, "guided_grammar": grammar})
    check(status == 200 and re.fullmatch(pattern, r["choices"][0]["message"]["content"]), f"chat: {r}")
    # Recursive: nested lists, sampled; a reply max_tokens cuts is a prefix of one.
    nested = 'root ::= "[" (item ("," item)*)? "]"\nitem ::= [a-z]+ | root\n'
    status, r = s.post("/v1/completions", {**body, "guided_grammar": nested, "temperature": 1, "seed": 5,
                                           "n": 6, "max_tokens": 24})
    outs = [(x["text"], x["finish_reason"]) for x in r["choices"]] if status == 200 else []
    check(len(outs) == 6 and all(bracket_list(t) == ("whole" if f == "stop" else "prefix") for t, f in outs)
          and any(f == "stop" for _, f in outs), f"nested lists: {outs}")
    for bad_body, param, words in [
            ({"guided_grammar": "root ::= root \"a\" | \"b\""}, "guided_grammar", "left-recursive"),
            ({"guided_grammar": "root ::= \"a\" b"}, "guided_grammar", "rule 'b' is used but not defined"),
            ({"guided_grammar": ""}, "guided_grammar", "non-empty string"),
            ({"guided_grammar": "root ::= \"a\"", "guided_regex": "a"}, "guided_grammar", "does not combine"),
            ({"guided_grammar": "root ::= \"a\"", "ebnf": "root ::= \"a\""}, "ebnf", "not both"),
            ({"ebnf": "root ::= [a-"}, "ebnf", "'[' without its ']' at line 1, column 10"),
            ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs", "structured_outputs.grammar")]:
        status, r = s.post("/v1/completions", {**body, **bad_body})
        check(status == 400 and r["error"]["param"] == param and words in r["error"]["message"],
              f"refused {bad_body}: {status} {r}")


def case_json_mode(s):
    """response_format json_object: the reply is one JSON object (Python's json decides) when it
    ends by itself; forced to close by a bias, whole, streamed and in a chat."""
    status, r = s.post("/tokenize", {"prompt": "}", "add_special_tokens": False})
    close = r["tokens"]
    check(status == 200 and len(close) == 1, f"'}}' is one token: {r}")
    body = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 48,
            "response_format": {"type": "json_object"}}
    for extra in [{}, {"logit_bias": {str(close[0]): 100}}, {"temperature": 1, "seed": 7, "n": 4}]:
        status, r = s.post("/v1/completions", {**body, **extra})
        check(status == 200, f"json_object {extra}: {r}")
        for c in r.get("choices", []):
            if c["finish_reason"] == "stop":
                check(isinstance(json.loads(c["text"]), dict), f"json_object {extra}: {c}")
            else:
                check(c["finish_reason"] == "length" and c["text"].startswith("{"), f"cut: {c}")
        if "logit_bias" in extra:
            check(r["choices"][0]["text"] == "{}" and r["choices"][0]["finish_reason"] == "stop",
                  f"'}}' forced: the smallest object: {r}")
            status, _, events = s.stream("/v1/completions", {**body, **extra, "stream": True})
            check("".join(e["choices"][0]["text"] for e in events[:-1]) == "{}", f"streamed: {events}")
            status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "JSON?"}],
                                                        "max_tokens": 8, "temperature": 0, **extra,
                                                        "response_format": {"type": "json_object"}})
            check(status == 200 and r["choices"][0]["message"]["content"] == "{}", f"chat: {r}")


def case_json_schema(s):
    """response_format json_schema, vLLM's guided_json and SGLang's json_schema: the reply is JSON
    valid under the schema, with its properties in the schema's order (not sorted)."""
    schema = {"type": "object", "properties": {
        "zeta": {"type": "string", "maxLength": 6},
        "alpha": {"enum": ["red", "green", 7, None]},
        "ok": {"type": "boolean"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit", 3]},
        "n": {"type": "integer", "minimum": -5, "exclusiveMaximum": 40},
        "list": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
        "required": ["zeta", "alpha", "ok", "unit", "n"]}

    def valid(text):
        v = json.loads(text)
        return (list(v)[:5] == ["zeta", "alpha", "ok", "unit", "n"] and isinstance(v["zeta"], str)
                and len(v["zeta"]) <= 6 and v["alpha"] in ["red", "green", 7, None] and isinstance(v["ok"], bool)
                and v["unit"] in ["celsius", "fahrenheit"] and type(v["n"]) is int and -5 <= v["n"] < 40
                and set(v) <= {"zeta", "alpha", "ok", "unit", "n", "list"}
                and all(isinstance(x, bool) for x in v.get("list", [])) and len(v.get("list", [])) <= 2)
    body = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 128}
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}
    status, r = s.post("/v1/completions", {**body, "response_format": fmt})
    c = r["choices"][0] if status == 200 else {}
    check(status == 200 and c["finish_reason"] == "stop" and valid(c["text"]), f"json_schema: {r}")
    status, r = s.post("/v1/completions", {**body, "guided_json": json.dumps(schema), "temperature": 1,
                                           "seed": 4, "n": 3})
    texts = [x["text"] for x in r["choices"]] if status == 200 else []
    check(len(texts) == 3 and all(valid(t) for t in texts), f"guided_json sampled: {texts}")
    status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "JSON"}],
                                                "max_tokens": 128, "temperature": 0, "response_format": fmt})
    check(status == 200 and valid(r["choices"][0]["message"]["content"]), f"chat json_schema: {r}")
    status, r = s.post("/generate", {"text": "Once upon a time", "sampling_params": {
        "max_new_tokens": 128, "temperature": 0, "json_schema": json.dumps(schema)}})
    check(status == 200 and valid(r["text"]), f"/generate json_schema: {r}")
    # Values the schema leaves free (any JSON nested at most 3 levels), a map and a tuple.
    free = {"type": "object", "properties": {
        "meta": {"type": "object"},
        "scores": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}, "maxProperties": 2},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}]},
        "any": {}}, "required": ["meta", "scores", "pair", "any"]}

    def levels(v):
        inner = [levels(x) for x in (v.values() if isinstance(v, dict) else v)] if isinstance(v, (dict, list)) else None
        return 0 if inner is None else 1 + max(inner, default=0)

    def valid_free(text):
        v = json.loads(text)
        return (list(v) == ["meta", "scores", "pair", "any"] and isinstance(v["meta"], dict) and levels(v["meta"]) <= 3
                and isinstance(v["scores"], dict) and len(v["scores"]) <= 2
                and all(type(x) is int and x >= 0 for x in v["scores"].values())
                and isinstance(v["pair"], list) and len(v["pair"]) <= 2
                and all(type(x) is t for x, t in zip(v["pair"], [int, bool])) and levels(v["any"]) <= 3)
    # Sampled (greedy, this random model repeats one token inside a free string to the limit):
    # every reply that ends is valid, and under this seed some do.
    status, r = s.post("/v1/completions", {**body, "temperature": 1, "seed": 3, "n": 4, "max_tokens": 400,
                                           "guided_json": free})
    done = [c["text"] for c in r.get("choices", []) if c["finish_reason"] == "stop"]
    check(status == 200 and done and all(valid_free(t) for t in done), f"free values: {r}")
    # Patterns that write what JSON escapes, one cut by maxLength (Pydantic's constr), one found
    # inside its string (unanchored: re.search); a dict keyed by an enum (propertyNames) and one
    # keyed by a constr (patternProperties).
    patterned = {"type": "object", "properties": {
        "mail": {"type": "string", "pattern": "^[^@]+@[^@]+$", "maxLength": 12},
        "line": {"type": "string", "pattern": "^.*$"},
        "tag": {"type": "string", "pattern": "[0-9]-", "maxLength": 10},
        "by_color": {"type": "object", "propertyNames": {"enum": ["red", "green"]},
                     "additionalProperties": {"type": "integer"}, "maxProperties": 2},
        "env": {"type": "object", "patternProperties": {"^[A-Z]+$": {"type": "boolean"}}, "maxProperties": 2}},
        "required": ["mail", "line", "tag", "by_color", "env"]}

    def valid_patterned(text):
        v = json.loads(text)
        return (list(v) == ["mail", "line", "tag", "by_color", "env"]
                and re.fullmatch("[^@]+@[^@]+", v["mail"]) is not None
                and len(v["mail"]) <= 12 and re.fullmatch(".*", v["line"]) is not None
                and re.search("[0-9]-", v["tag"]) is not None and len(v["tag"]) <= 10
                and all(k in ("red", "green") and type(x) is int for k, x in v["by_color"].items())
                and all(re.fullmatch("[A-Z]+", k) and type(x) is bool for k, x in v["env"].items()))
    status, r = s.post("/v1/completions", {**body, "temperature": 1, "seed": 5, "n": 4, "max_tokens": 300,
                                           "guided_json": patterned})
    done = [c["text"] for c in r.get("choices", []) if c["finish_reason"] == "stop"]
    check(status == 200 and done and all(valid_patterned(t) for t in done), f"patterns: {r}")
    # Pydantic's Decimal: a number, or a string of a number's text (a pattern opened by a look-ahead);
    # the tax only the string.
    decimal = {"anyOf": [{"type": "number"},
                         {"type": "string", "pattern": r"^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$"}]}
    priced = {"type": "object", "properties": {"price": decimal, "tax": decimal["anyOf"][1]},
              "required": ["price", "tax"]}

    def valid_decimal(v):
        if isinstance(v, str):  # the pattern's look-ahead $ is the end of the text: Python's \Z
            return re.fullmatch(r"(?!^[-+.]*\Z)[+-]?0*\d*\.?\d*", v, re.ASCII) is not None
        return type(v) in (int, float)
    status, r = s.post("/v1/completions", {**body, "temperature": 1, "seed": 8, "n": 4, "max_tokens": 100,
                                           "guided_json": priced})
    done = [json.loads(c["text"]) for c in r.get("choices", []) if c["finish_reason"] == "stop"]
    check(status == 200 and done and all(list(v) == ["price", "tax"] and valid_decimal(v["price"])
                                          and valid_decimal(v["tax"]) for v in done), f"decimals: {r}")


def case_structured_outputs(s):
    """vLLM's structured_outputs object: each of its constraints gives the reply the guided_* field
    it replaces gives (greedy, so the same text); what it cannot honour is refused naming it."""
    body = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 64}
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "y"]}},
              "required": ["a", "b"]}
    for so, legacy in [({"regex": r"\d{2}-[a-z]{3}"}, {"guided_regex": r"\d{2}-[a-z]{3}"}),
                       ({"choice": ["red", "blue"]}, {"guided_choice": ["red", "blue"]}),
                       ({"json": schema}, {"guided_json": schema}),
                       ({"json": json.dumps(schema), "disable_additional_properties": True}, {"guided_json": schema}),
                       ({"json_object": True}, {"response_format": {"type": "json_object"}})]:
        status, r = s.post("/v1/completions", {**body, "structured_outputs": so})
        status2, want = s.post("/v1/completions", {**body, **legacy})
        check(status == status2 == 200 and r["choices"][0]["text"] == want["choices"][0]["text"]
              and r["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"],
              f"structured_outputs {so}: {r} vs {want}")
    status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "?"}], "max_tokens": 8,
                                                "temperature": 0, "structured_outputs": {"choice": ["yes", "no"]}})
    check(status == 200 and r["choices"][0]["message"]["content"] in ("yes", "no"), f"chat structured_outputs: {r}")
    for bad_body, words in [({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
                            ({"structured_outputs": {"regex": "a"}, "guided_regex": "a"}, "not both"),
                            ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
                            ({"structured_outputs": {"json": {"type": "integer", "multipleOf": 2.5}}},
                             "structured_outputs.json"),
                            ({"structured_outputs": {"choice": "red"}}, "structured_outputs.choice"),
                            ({"structured_outputs": ["regex"]}, "must be an object")]:
        status, r = s.post("/v1/completions", {**body, **bad_body})
        check(status == 400 and r["error"]["param"] == "structured_outputs" and words in r["error"]["message"],
              f"refused {bad_body}: {status} {r}")


def case_tokenize(s):
    """/tokenize and /detokenize give the ids and text dcp tokenize gives, and what the generation
    endpoints count."""
    def cli(text, *flags):
        out = subprocess.run([DCP, "tokenize", "--tokenizer-path", CKPT, *flags], input=text,
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)
    text = "Once upon a time, 42 cats"
    status, r = s.post("/tokenize", {"prompt": text})
    want = cli(text, "--add-special-tokens")
    check(status == 200 and r == {"count": len(want), "max_model_len": 4096, "tokens": want},
          f"/tokenize {r} != dcp tokenize {want}")
    status, c = s.post("/v1/completions", {"prompt": text, "max_tokens": 1})
    check(c["usage"]["prompt_tokens"] == r["count"], f"a completion counts {c['usage']} prompt tokens")
    status, r = s.post("/tokenize", {"prompt": text, "add_special_tokens": False, "return_token_strs": True})
    with open(os.path.join(CKPT, "tokenizer.json")) as f:
        piece = {i: p for p, i in json.load(f)["model"]["vocab"].items()}
    check(status == 200 and r["tokens"] == cli(text) and r["token_strs"] == [piece[i] for i in r["tokens"]]
          and "".join(r["token_strs"]).replace("\u0120", " ") == text,
          f"/tokenize without special tokens, each token as the vocabulary spells it: {r}")
    messages = [{"role": "user", "content": "Name a color."}]
    status, r = s.post("/tokenize", {"messages": messages})
    want = cli(json.dumps(messages), "--chat", "--add-generation-prompt")
    check(status == 200 and r["tokens"] == want, f"/tokenize of a chat {r} != dcp tokenize --chat {want}")
    status, c = s.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    check(c["usage"]["prompt_tokens"] == len(want), f"a chat counts {c['usage']} prompt tokens")
    status, r = s.post("/tokenize", {"messages": messages, "add_generation_prompt": False})
    check(status == 200 and r["tokens"] == cli(json.dumps(messages), "--chat"),
          f"add_generation_prompt false: {r}")
    ids = cli(text, "--add-special-tokens")
    status, r = s.post("/detokenize", {"tokens": ids})
    want = subprocess.run([DCP, "tokenize", "--tokenizer-path", CKPT, "--decode"], input=json.dumps(ids),
                          capture_output=True, text=True, check=True).stdout
    check(status == 200 and r == {"prompt": want} and want.endswith(text),
          f"/detokenize {r} != dcp tokenize --decode {want!r}")


def case_chat_options(s):
    """vLLM's chat fields: continue_final_message, a request's own chat_template with
    chat_template_kwargs and documents, add_special_tokens; each checked against the text it must
    render, tokenized by dcp tokenize."""
    def ids(text):
        out = subprocess.run([DCP, "tokenize", "--tokenizer-path", CKPT], input=text,
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out)
    turns = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "The color is"}]
    body = {"messages": turns, "add_generation_prompt": False, "continue_final_message": True}
    status, r = s.post("/tokenize", body)
    want = ids("<s><|user|>Name a color.<|assistant|>The color is")
    check(status == 200 and r["tokens"] == want, f"continue_final_message ends in the message: {r} != {want}")
    status, c = s.post("/v1/chat/completions", {**body, "max_tokens": 2, "temperature": 0})
    check(status == 200 and c["usage"]["prompt_tokens"] == len(want), f"the chat continues that prompt: {c}")
    status, g = s.post("/generate", {"input_ids": want, "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    check(c["choices"][0]["message"]["content"] == g["text"], f"its reply is that prompt's: {c} {g}")
    status, r = s.post("/tokenize", {"messages": turns, "add_generation_prompt": False})
    check(status == 200 and r["tokens"] == ids("<s><|user|>Name a color.<|assistant|>The color is</s>"),
          f"without it the turn is closed: {r}")
    template = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"
                "{% if flavor %}+{{ flavor }}{% endif %}{% for d in documents %}|{{ d.title }}{% endfor %}")
    status, r = s.post("/tokenize", {"messages": turns[:1], "chat_template": template,
                                     "chat_template_kwargs": {"flavor": "mint"},
                                     "documents": [{"title": "a"}, {"title": "b"}]})
    check(status == 200 and r["tokens"] == ids("[user] Name a color.+mint|a|b"),
          f"the request's template, variables and documents: {r}")
    status, r = s.post("/tokenize", {"messages": turns[:1], "chat_template": "{{ messages[0].content }}",
                                     "add_special_tokens": True})
    check(status == 200 and r["tokens"] == ids("<s>Name a color."), f"add_special_tokens adds the BOS: {r}")
    status, r = s.post("/v1/completions", {"prompt": "Name a color.", "max_tokens": 1, "add_special_tokens": False})
    check(status == 200 and r["usage"]["prompt_tokens"] == len(ids("Name a color.")),
          f"a completion without the BOS: {r}")
    # Content as a list of text parts, as vLLM hands it to a template: joined by "\n" for one that
    # writes content as a string (this checkpoint's), passed as parts to one that loops over them.
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name"}, {"type": "text", "text": "a color."}]}]
    status, r = s.post("/tokenize", {"messages": parts})
    check(status == 200 and r["tokens"] == ids("<s><|user|>Name\na color.<|assistant|>"),
          f"text parts joined by a newline: {r}")
    loop = "{% for m in messages %}{% for p in m['content'] %}({{ p.text }}){% endfor %}{% endfor %}"
    status, r = s.post("/tokenize", {"messages": parts, "chat_template": loop})
    check(status == 200 and r["tokens"] == ids("(Name)(a color.)"), f"parts to a template that reads them: {r}")
    status, r = s.post("/tokenize", {"messages": parts + [{"role": "assistant", "content": [{"type": "text", "text": "The"},
                                                                                           {"type": "text", "text": "color is"}]}],
                                     "add_generation_prompt": False, "continue_final_message": True})
    check(status == 200 and r["tokens"] == ids("<s><|user|>Name\na color.<|assistant|>The\ncolor is"),
          f"continue_final_message on parts: {r}")
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    status, r = s.post("/v1/chat/completions", {"messages": image, "max_tokens": 1})
    check(status == 400 and r["error"]["param"] == "messages" and "messages[0].content[0]" in r["error"]["message"]
          and "'image_url'" in r["error"]["message"], f"an image part: {status} {r}")


def case_min_tokens(s):
    """min_tokens holds a stop token (and stop strings) back: a token biased to be chosen at every
    step is also the stop token; it ends the request only at step min_tokens + 1."""
    body = {"prompt": [1, 2, 3], "max_tokens": 10, "temperature": 0, "ignore_eos": True,
            "logit_bias": {"9": 100}, "stop_token_ids": [9]}
    status, r = s.post("/v1/completions", body)
    check(status == 200 and r["choices"][0]["token_ids"] == [9], f"without min_tokens: stops at once: {r}")
    status, r = s.post("/v1/completions", {**body, "min_tokens": 3})
    ids = r["choices"][0]["token_ids"] if status == 200 else []
    check(len(ids) == 4 and ids[-1] == 9 and 9 not in ids[:3], f"min_tokens 3: the stop token 4th: {r}")
    check(r["choices"][0]["finish_reason"] == "stop", f"finish_reason stop: {r}")
    status, r = s.post("/generate", {"input_ids": [1, 2, 3], "sampling_params": {
        "max_new_tokens": 10, "temperature": 0, "ignore_eos": True, "logit_bias": {"9": 100},
        "stop_token_ids": [9], "min_new_tokens": 2}})
    check(status == 200 and r["output_ids"][:2] != [9, 9] and r["output_ids"][2:] == [9],
          f"/generate's min_new_tokens: {r}")
    # A stop string within the first min_tokens tokens' text does not count.
    text_body = {"prompt": [1, 2, 3], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    status, r = s.post("/v1/completions", text_body)
    text = r["choices"][0]["text"]
    status, r = s.post("/v1/completions", {**text_body, "stop": [text[:1]], "min_tokens": 6})
    check(status == 200 and r["choices"][0]["text"] == text, f"a stop string held back by min_tokens: {r}")
    # The stop token that ends a reply is counted but not written, even with special tokens kept
    # (vLLM's); with include_stop_str_in_output it is written.
    status, eos = s.post("/tokenize", {"prompt": "</s>", "add_special_tokens": False})
    body = {"prompt": [1, 2, 3], "max_tokens": 6, "temperature": 0, "min_tokens": 2,
            "logit_bias": {str(eos["tokens"][0]): 100}, "skip_special_tokens": False}
    status, r = s.post("/v1/completions", body)
    c = r["choices"][0] if status == 200 else {}
    check(status == 200 and c["token_ids"][-1] == eos["tokens"][0] and len(c["token_ids"]) == 3
          and c["text"] == text[:len(c["text"])] and not c["text"].endswith("</s>"), f"EOS not written: {r}")
    status, r2 = s.post("/v1/completions", {**body, "include_stop_str_in_output": True})
    check(status == 200 and r2["choices"][0]["text"] == c.get("text", "") + "</s>", f"EOS kept: {r2}")


def case_echo(s):
    """echo: the prompt comes back before the text; with logprobs, the prompt's own. A prompt that
    is the model's greedy continuation has, at each of those tokens, the logprob decoding gave
    it. With max_tokens 0, the prompt alone."""
    base = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    status, r = s.post("/v1/completions", {**base, "prompt": "Once upon a time"})
    plain = r["choices"][0]
    status, r = s.post("/v1/completions", {**base, "prompt": "Once upon a time", "echo": True})
    check(status == 200 and r["choices"][0]["text"] == "Once upon a time" + plain["text"], f"echo: {r}")
    check(r["choices"][0]["token_ids"] == plain["token_ids"], "token_ids stay the completion's")
    status, r = s.post("/v1/completions", {**base, "prompt": [1, 2, 3], "logprobs": 1})
    greedy, decoded = r["choices"][0]["token_ids"], r["choices"][0]["logprobs"]["token_logprobs"]
    prompt = [1, 2, 3] + greedy
    status, r = s.post("/v1/completions", {**base, "max_tokens": 2, "prompt": prompt, "echo": True, "logprobs": 2})
    lp = r["choices"][0]["logprobs"] if status == 200 else {}
    check(status == 200, f"echo with logprobs: {status} {r}")
    check(len(lp.get("tokens", [])) == len(prompt) + 2, f"echo logprobs cover prompt and completion: {lp}")
    check(lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, "the first prompt token has none")
    scored = lp["token_logprobs"][3:len(prompt)]
    check(all(abs(a - b) < 0.05 for a, b in zip(scored, decoded)) and len(scored) == len(decoded),
          f"prompt logprobs {scored} equal decoding's {decoded}")
    check(all(len(t) <= 2 for t in lp["top_logprobs"][1:]), "at most 2 alternatives")
    check(lp["text_offset"] == sorted(lp["text_offset"]), "text offsets run on")
    status, r = s.post("/v1/completions", {**base, "prompt": [[1, 2], [4, 5, 6]], "echo": True, "logprobs": 0})
    check(status == 200 and [len(c["logprobs"]["tokens"]) for c in r["choices"]] == [8, 9],
          f"each prompt of a batch echoes itself: {r}")
    # max_tokens 0 with echo (OpenAI's, as harnesses score a text): the prompt and its logprobs
    # alone, those the echo of a longer request gives it.
    status, alone = s.post("/v1/completions", {**base, "max_tokens": 0, "prompt": prompt, "echo": True, "logprobs": 2})
    c = alone["choices"][0] if status == 200 else {}
    check(status == 200 and c["token_ids"] == [] and c["finish_reason"] == "length",
          f"max_tokens 0 with echo: no token, finish_reason length: {status} {alone}")
    check(alone.get("usage", {}).get("completion_tokens") == 0 and
          alone["usage"]["total_tokens"] == alone["usage"]["prompt_tokens"] == len(prompt),
          f"max_tokens 0 counts no completion token: {alone.get('usage')}")
    got_lp = c.get("logprobs") or {}
    check(got_lp.get("tokens") == lp["tokens"][:len(prompt)] and
          got_lp.get("text_offset") == lp["text_offset"][:len(prompt)] and
          all((a is None and b is None) or abs(a - b) < 1e-4
              for a, b in zip(got_lp["token_logprobs"], lp["token_logprobs"][:len(prompt)])) and
          [set(t or {}) for t in got_lp["top_logprobs"]] == [set(t or {}) for t in lp["top_logprobs"][:len(prompt)]],
          f"max_tokens 0: the prompt's logprobs {got_lp} != the echo's {lp}")
    status, text_alone = s.post("/v1/completions", {**base, "max_tokens": 0, "prompt": "Once upon a time", "echo": True})
    check(status == 200 and text_alone["choices"][0]["text"] == "Once upon a time",
          f"max_tokens 0 with echo: the prompt's text alone: {text_alone}")
    for extra, param in [({}, "max_tokens"), ({"echo": True, "min_tokens": 1}, "min_tokens")]:
        status, r = s.post("/v1/completions", {**base, "max_tokens": 0, "prompt": prompt, **extra})
        check(status == 400 and r["error"]["param"] == param, f"max_tokens 0 with {extra}: {status} {r}")
    # Streamed: each choice's first chunk leads with its prompt; the pieces join to the whole reply.
    for body in [{**base, "prompt": "Once upon a time", "echo": True},
                 {**base, "max_tokens": 2, "prompt": prompt, "echo": True, "logprobs": 2},
                 {**base, "max_tokens": 0, "prompt": prompt, "echo": True, "logprobs": 2},
                 {**base, "prompt": [[1, 2], [4, 5, 6]], "echo": True, "logprobs": 0, "n": 2}]:
        status, whole = s.post("/v1/completions", body)
        status, _, events = s.stream("/v1/completions", {**body, "stream": True})
        for c in whole["choices"]:
            pieces = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == c["index"]]
            check("".join(p["text"] for p in pieces) == c["text"], f"streamed echo {pieces} != {c['text']!r}")
            if c["logprobs"]:
                # Equal but for float rounding: batches that differ round alike only nearly.
                joined = {k: [x for p in pieces for x in p["logprobs"][k]] for k in c["logprobs"]}
                same = all(joined[k] == c["logprobs"][k] for k in ["tokens", "text_offset"])
                same = same and [set(t or {}) for t in joined["top_logprobs"]] == \
                    [set(t or {}) for t in c["logprobs"]["top_logprobs"]]
                same = same and all((a is None and b is None) or abs(a - b) < 1e-4 for a, b in
                                    zip(joined["token_logprobs"], c["logprobs"]["token_logprobs"]))
                check(same, f"streamed echo logprobs {joined} != {c['logprobs']}")


def case_prompt_logprobs(s):
    """vLLM's prompt_logprobs: null for the first prompt token, then an object keyed by token id
    holding the prompt's token (its logprob and rank over the vocabulary) and the k most likely,
    ranked 1 to k. A prompt that is the model's greedy continuation has, at those tokens, rank 1
    and the logprob decoding gave it; a rank within the top 20 is the token's place among 20
    alternatives; each text is what /detokenize gives for the token alone (none for an id past the
    tokenizer's vocabulary)."""
    base = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}
    status, r = s.post("/v1/completions", {**base, "prompt": [1, 2, 3], "logprobs": 1})
    greedy, decoded = r["choices"][0]["token_ids"], r["choices"][0]["logprobs"]["token_logprobs"]
    prompt = [1, 2, 3] + greedy + [7, 400, 12]
    status, r = s.post("/v1/completions", {**base, "prompt": prompt, "prompt_logprobs": 4})
    check(status == 200, f"prompt_logprobs: {status} {r}")
    if status != 200:
        return
    plp = r["choices"][0]["prompt_logprobs"]
    check(len(plp) == len(prompt) and plp[0] is None, f"one entry per prompt token, the first null: {plp}")
    status, wide = s.post("/v1/completions", {**base, "prompt": prompt, "prompt_logprobs": 20})
    wide = wide["choices"][0]["prompt_logprobs"]
    status, echo = s.post("/v1/completions", {**base, "max_tokens": 0, "prompt": prompt, "echo": True, "logprobs": 4})
    echoed = echo["choices"][0]["logprobs"]["token_logprobs"]
    texts = {}
    for p in range(1, len(plp)):
        at, own = plp[p], str(prompt[p])
        if own not in at:
            check(False, f"position {p}: the prompt's token {own} is missing: {at}")
            continue
        ranked = sorted(at.values(), key=lambda e: e["rank"])
        alternatives = [e for e in ranked if e["rank"] <= 4]
        check([e["rank"] for e in alternatives] == [1, 2, 3, 4] and len(at) in (4, 5),
              f"position {p}: four alternatives ranked 1-4 and the prompt's token: {at}")
        check(all(a["logprob"] >= b["logprob"] for a, b in zip(ranked, ranked[1:])),
              f"position {p}: logprobs fall with the rank: {at}")
        check(abs(at[own]["logprob"] - echoed[p]) < 1e-4, f"position {p}: {at[own]} != the echo's {echoed[p]}")
        order = sorted(wide[p].items(), key=lambda kv: -kv[1]["logprob"])
        if at[own]["rank"] <= 20:
            check(order[at[own]["rank"] - 1][0] == own, f"position {p}: rank {at[own]['rank']} is the place among 20: {order}")
        else:
            check(own not in [k for k, e in order if e["rank"] <= 20] and at[own]["logprob"] <= order[19][1]["logprob"],
                  f"position {p}: a rank above 20 is below the 20 alternatives: {at[own]} {order}")
        for k, e in at.items():
            texts[int(k)] = e["decoded_token"]
    for p in range(3, 3 + len(greedy)):
        e = plp[p][str(prompt[p])]
        check(e["rank"] == 1 and abs(e["logprob"] - decoded[p - 3]) < 0.05,
              f"position {p}: the greedy token has rank 1 and decoding's logprob {decoded[p - 3]}: {e}")
    compared = 0
    for token, text in texts.items():  # ids past the tokenizer's vocabulary (the model's is larger) have none
        status, d = s.post("/detokenize", {"tokens": [token]})
        compared += status == 200
        check(d["prompt"] == text if status == 200 else text == "", f"token {token}: decoded_token {text!r}, /detokenize {d}")
    check(compared >= 5, f"decoded tokens compared: {compared}")
    # 0: the prompt's token alone; a batch of prompts with n = 2: each choice its prompt's.
    status, r = s.post("/v1/completions", {**base, "prompt": [[1, 2], [4, 5, 6]], "n": 2, "prompt_logprobs": 0})
    check(status == 200 and [len(c["prompt_logprobs"]) for c in r["choices"]] == [2, 2, 3, 3] and
          all(len(e) == 1 for c in r["choices"] for e in c["prompt_logprobs"][1:]),
          f"prompt_logprobs 0 over a batch: {r}")
    status, plain = s.post("/v1/completions", {**base, "prompt": prompt})
    check("prompt_logprobs" not in plain["choices"][0], "no prompt_logprobs unless asked for")
    # Chat: one list beside the choices, over the templated prompt.
    status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                "prompt_logprobs": 1})
    check(status == 200 and len(r["prompt_logprobs"]) == r["usage"]["prompt_tokens"] and r["prompt_logprobs"][0] is None,
          f"chat prompt_logprobs: {r}")
    for path, body in [("/v1/completions", {**base, "prompt": prompt, "prompt_logprobs": 2, "stream": True}),
                       ("/v1/completions", {**base, "prompt": prompt, "prompt_logprobs": -1}),
                       ("/v1/completions", {**base, "prompt": prompt, "prompt_logprobs": 21}),
                       ("/v1/completions", {**base, "prompt": prompt, "prompt_logprobs": "2"}),
                       ("/generate", {"input_ids": prompt, "prompt_logprobs": 2})]:
        status, r = s.post(path, body)
        check(status == 400 and r["error"]["param"] == "prompt_logprobs", f"{path} {body}: {status} {r}")


def case_generate_logprobs(s):
    """SGLang's /generate logprobs: meta_info holds [logprob, token id, text or null] for the output
    tokens and, from logprob_start_len on, the prompt's (its first token without a logprob); with
    top_logprobs_num the most likely tokens at each. A prompt that is the model's greedy
    continuation has, at those tokens, the logprob decoding gave them; a later start is the same
    list cut; texts are what /detokenize gives; a stream carries everything so far."""
    base = {"sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}, "return_logprob": True}
    status, r = s.post("/generate", {**base, "input_ids": [1, 2, 3]})
    meta = r.get("meta_info", {})
    out = meta.get("output_token_logprobs")
    check(status == 200 and out is not None and [e[1] for e in out] == r["output_ids"] and len(out) == 4 and
          all(e[2] is None and e[0] <= 0 for e in out), f"output_token_logprobs: {status} {r}")
    check(meta.get("input_token_logprobs") == [] and "output_top_logprobs" not in meta,
          f"by default no prompt logprobs and no alternatives: {meta}")
    if status != 200:
        return
    status, v = s.post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                                           "logprobs": 0})
    check([e[0] for e in out] == v["choices"][0]["logprobs"]["token_logprobs"],
          f"the logprobs /v1/completions gives: {out} {v['choices'][0]['logprobs']}")
    greedy = r["output_ids"]
    prompt = [1, 2, 3] + greedy + [7, 400]
    body = {**base, "input_ids": prompt, "logprob_start_len": 0, "top_logprobs_num": 3, "return_text_in_logprobs": True}
    status, whole = s.post("/generate", body)
    meta = whole.get("meta_info", {})
    inp, tops = meta.get("input_token_logprobs", []), meta.get("input_top_logprobs", [])
    check(status == 200 and [e[1] for e in inp] == prompt and inp[0][0] is None and tops[0] is None and
          len(tops) == len(prompt), f"the prompt's from position 0: {status} {whole}")
    if status != 200:
        return
    check(all(abs(inp[3 + i][0] - out[i][0]) < 0.05 for i in range(len(greedy))),
          f"a greedy continuation's prompt logprobs {inp[3:3 + len(greedy)]} equal decoding's {out}")
    for lists in [tops[1:], meta["output_top_logprobs"]]:
        check(all(len(t) == 3 and all(a[0] >= b[0] for a, b in zip(t, t[1:])) for t in lists),
              f"three alternatives each, most likely first: {lists}")
    check(all(abs(t[0][0] - e[0]) < 1e-5 and t[0][1] == e[1] for t, e in zip(meta["output_top_logprobs"],
                                                                             meta["output_token_logprobs"])),
          "greedy chooses the most likely token")
    check(all(e[0] <= t[0][0] + 1e-5 for e, t in zip(inp[1:], tops[1:])), "no prompt token above the most likely")
    texts = {e[1]: e[2] for e in inp + meta["output_token_logprobs"]} | {a[1]: a[2] for t in tops[1:] for a in t}
    compared = 0
    for token, text in texts.items():  # ids past the tokenizer's vocabulary have no text
        status, d = s.post("/detokenize", {"tokens": [token]})
        compared += status == 200
        check(d["prompt"] == text if status == 200 else text == "", f"token {token}: text {text!r}, /detokenize {d}")
    check(compared >= 5, f"texts compared: {compared}")
    # A later start: the same entries, cut; the prompt's length: none of them.
    for start in [4, len(prompt)]:
        status, cut = s.post("/generate", {**body, "logprob_start_len": start})
        got = cut["meta_info"]["input_token_logprobs"] if status == 200 else None
        check(got is not None and [e[1] for e in got] == prompt[start:] and
              all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(got, inp[start:])) and
              len(cut["meta_info"]["input_top_logprobs"]) == len(prompt) - start,
              f"logprob_start_len {start}: {status} {cut}")
    # Streamed: every event holds the lists so far; the last equals the whole reply.
    status, _, events = s.stream("/generate", {**body, "stream": True})
    last = events[-2]["meta_info"] if len(events) >= 2 else {}
    check(all(len(e["meta_info"]["output_token_logprobs"]) == len(e["output_ids"]) for e in events[:-1]),
          f"each event: a logprob per token so far: {events}")
    check(last.get("input_token_logprobs", [None])[0] == inp[0] and
          [e[1] for e in last.get("output_token_logprobs", [])] == [e[1] for e in meta["output_token_logprobs"]] and
          all((a[0] is None and b[0] is None) or abs(a[0] - b[0]) < 1e-4
              for a, b in zip(last["input_token_logprobs"] + last["output_token_logprobs"],
                              inp + meta["output_token_logprobs"])),
          f"the stream's last event {last} != the whole reply {meta}")
    for extra, param in [({"top_logprobs_num": 21}, "top_logprobs_num"),
                         ({"logprob_start_len": len(prompt) + 1}, "logprob_start_len"),
                         ({"logprob_start_len": -2}, "logprob_start_len"),
                         ({"return_logprob": False, "logprob_start_len": 0}, "logprob_start_len"),
                         ({"return_logprob": False, "top_logprobs_num": 2}, "top_logprobs_num"),
                         ({"return_logprob": False, "return_text_in_logprobs": True}, "return_text_in_logprobs"),
                         ({"token_ids_logprob": [1, 2]}, "token_ids_logprob"),
                         ({"sampling_params": {"max_new_tokens": 2, "top_logprobs_num": 2}}, "top_logprobs_num")]:
        status, r = s.post("/generate", {**base, "input_ids": prompt, **extra})
        check(status == 400 and r["error"]["param"] == param, f"/generate {extra}: {status} {r}")
    status, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 2, "logprob_start_len": 0})
    check(status == 400 and r["error"]["param"] == "logprob_start_len", f"logprob_start_len on completions: {r}")


def case_generate_batch(s):
    """SGLang's batched /generate: `text` or `input_ids` as a list answers with a list, in order,
    each reply the one that prompt gets alone; sampling_params and the logprob fields given as
    lists apply per prompt; a stream's events name their prompt's index and end as the whole
    replies; a batch one of whose prompts cannot be served is refused whole, its KV freed."""
    prompts = [[1, 2, 3], [50, 60], PROMPT]
    params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in (3, 5, 2)]
    alone = [s.post("/generate", {"input_ids": p, "sampling_params": sp})[1] for p, sp in zip(prompts, params)]
    status, r = s.post("/generate", {"input_ids": prompts, "sampling_params": params})
    check(status == 200 and isinstance(r, list) and [x["output_ids"] for x in r] == [a["output_ids"] for a in alone]
          and [x["meta_info"]["prompt_tokens"] for x in r] == [3, 2, len(PROMPT)],
          f"a batch of token-id prompts: {status} {r} vs alone {alone}")
    if status == 200:
        check(len({x["meta_info"]["id"] for x in r}) == 3, f"each prompt its own id: {r}")
    status, r = s.post("/generate", {"text": ["Once upon", "a time"], "sampling_params": params[0]})
    texts = [s.post("/generate", {"text": t, "sampling_params": params[0]})[1] for t in ["Once upon", "a time"]]
    check(status == 200 and [x["text"] for x in r] == [t["text"] for t in texts],
          f"a batch of texts with one sampling_params for all: {r} vs {texts}")
    status, r = s.post("/generate", {"input_ids": prompts, "sampling_params": params,
                                     "return_logprob": [True, False, True], "top_logprobs_num": [2, 0, 0]})
    metas = [x["meta_info"] for x in r] if status == 200 else [{}, {}, {}]
    check(len(metas[0].get("output_top_logprobs", [])) == 3 and "output_token_logprobs" not in metas[1] and
          len(metas[2].get("output_token_logprobs", [])) == 2 and "output_top_logprobs" not in metas[2],
          f"logprob fields per prompt: {status} {metas}")
    status, _, events = s.stream("/generate", {"input_ids": prompts, "sampling_params": params, "stream": True})
    last = {}
    for e in events[:-1]:
        last[e["index"]] = e
    check(events[-1] == "[DONE]" and sorted(last) == [0, 1, 2] and
          all(last[i]["output_ids"] == alone[i]["output_ids"] and last[i]["meta_info"]["finish_reason"]["type"] == "length"
              for i in range(3)), f"a streamed batch: {events}")
    # SGLang's n: each prompt's samples in a row, sample j seeded seed + j as /v1/completions seeds
    # its choices.
    sampled = {"max_new_tokens": 6, "temperature": 0.9, "sampling_seed": 5, "ignore_eos": True}
    status, c = s.post("/v1/completions", {"prompt": prompts[0], "max_tokens": 6, "temperature": 0.9, "seed": 5,
                                           "ignore_eos": True, "n": 3})
    want = [x["token_ids"] for x in c["choices"]]
    status, r = s.post("/generate", {"input_ids": prompts[0], "sampling_params": {**sampled, "n": 3}})
    check(status == 200 and isinstance(r, list) and [x["output_ids"] for x in r] == want and len(set(map(str, want))) > 1
          and len({x["meta_info"]["id"] for x in r}) == 3, f"n = 3: {status} {r} vs {want}")
    status, r = s.post("/generate", {"input_ids": prompts[:2], "sampling_params": [{**sampled, "n": 2}, params[1]]})
    check(status == 200 and [x["output_ids"] for x in r] == want[:2] + [alone[1]["output_ids"]],
          f"a batch with n = 2 for its first prompt: {status} {r}")
    status, _, events = s.stream("/generate", {"input_ids": prompts[0], "sampling_params": {**sampled, "n": 3},
                                               "stream": True})
    last = {}
    for e in events[:-1]:
        last[e["index"]] = e["output_ids"]
    check([last.get(i) for i in range(3)] == want, f"n = 3 streamed: {last} vs {want}")
    # One prompt too long for the context: the whole batch is refused, nothing left running.
    status, r = s.post("/generate", {"input_ids": [[1, 2], [1] * 5000], "sampling_params": {"max_new_tokens": 2}})
    check(status in (400, 413) and r["error"]["param"] in ("input_ids", None), f"a batch with a prompt too long: {status} {r}")
    deadline = time.time() + 10
    while time.time() < deadline and s.metrics().get("dcp_num_running_reqs", 1) + s.metrics().get("dcp_num_queued_reqs", 1) > 0:
        time.sleep(0.1)
    check(s.metrics().get("dcp_num_running_reqs") == 0 and s.metrics().get("dcp_num_queued_reqs") == 0,
          "a refused batch leaves nothing running")


def case_server_info(s):
    """SGLang's descriptions of the model and the server, and vLLM's /version: what the server
    was started with (TP 2, DCP 2, 4096 tokens of KV, a generated checkpoint with its tokenizer),
    the context /v1/models gives, the version `dcp --version` prints; /health_generate serves a
    one-token request."""
    version = subprocess.run([DCP, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    status, models = s.request("GET", "/v1/models")
    for path in ["/get_model_info", "/model_info"]:
        status, r = s.request("GET", path)
        check(status == 200 and r.get("model_path") == CKPT and r.get("tokenizer_path") == CKPT and
              r.get("is_generation") is True and r.get("served_model_name") == models["data"][0]["id"],
              f"{path}: {status} {r}")
    for path in ["/get_server_info", "/server_info"]:
        status, r = s.request("GET", path)
        check(status == 200 and r.get("tp_size") == 2 and r.get("dcp_size") == 2 and r.get("dp_size") == 1 and
              r.get("max_total_num_tokens") == 4096 and r.get("context_length") == models["data"][0]["max_model_len"] and
              r.get("version") == version and r.get("disable_radix_cache") is True and
              r.get("internal_states", [{}])[0].get("num_running_reqs") == 0, f"{path}: {status} {r}")
    status, r = s.request("GET", "/version")
    check(status == 200 and r == {"version": version} and re.fullmatch(r"\d+\.\d+\.\d+", version), f"/version: {r}")
    before = s.metrics()["dcp_requests_total{outcome=\"finished\"}"]
    status, r = s.request("GET", "/health_generate")
    check(status == 200 and s.metrics()["dcp_requests_total{outcome=\"finished\"}"] == before + 1,
          f"/health_generate serves a request: {status} {r}")


def case_abort_request():
    """SGLang's rid and /abort_request: a /generate request keeps the id its client gave it, which
    no other running request may take; aborting it (or all) ends it with finish_reason abort and
    frees its KV; then the id is free again. Its own server, with KV for requests long enough
    (tens of thousands of tokens) that an abort surely reaches them running."""
    s = Server("--max-total-tokens", "65536")
    try:
        abort_cases(s)
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")


def abort_cases(s):
    long = {"max_new_tokens": 30000, "temperature": 0, "ignore_eos": True}
    got = {}

    def streamed():
        got["stream"] = s.stream("/generate", {"input_ids": [1, 2, 3], "sampling_params": long, "rid": "job-1",
                                               "stream": True})

    t = threading.Thread(target=streamed)
    t.start()
    deadline = time.time() + 30
    while time.time() < deadline and s.metrics().get("dcp_num_running_reqs", 0) < 1:
        time.sleep(0.05)
    status, r = s.post("/generate", {"input_ids": [4, 5], "rid": "job-1"})
    check(status == 400 and r["error"]["param"] == "rid", f"a running request's rid taken again: {status} {r}")
    status, r = s.post("/abort_request", {"rid": "job-1"})
    check(status == 200 and r == {}, f"abort: {status} {r}")
    t.join(60)
    events = got.get("stream", (0, "", []))[2]
    last = events[-2] if len(events) >= 2 else {}
    check(last.get("meta_info", {}).get("finish_reason", {}).get("type") == "abort" and
          last["meta_info"]["id"] == "job-1" and len(last["output_ids"]) < 30000,
          f"the aborted stream ends with abort: {last}")
    status, r = s.post("/generate", {"input_ids": [4, 5], "rid": "job-1", "sampling_params": {"max_new_tokens": 2}})
    check(status == 200 and r["meta_info"]["id"] == "job-1", f"the rid is free again: {status} {r}")
    # abort_all: two whole replies waiting, both end with abort.
    replies = []

    def whole(rid):
        replies.append(s.post("/generate", {"input_ids": [7, 8], "sampling_params": long, "rid": rid}))

    threads = [threading.Thread(target=whole, args=(f"all-{k}",)) for k in range(2)]
    for th in threads:
        th.start()
    deadline = time.time() + 30
    while time.time() < deadline and s.metrics().get("dcp_num_running_reqs", 0) < 2:
        time.sleep(0.05)
    status, r = s.post("/abort_request", {"abort_all": True})
    for th in threads:
        th.join(60)
    check(status == 200 and len(replies) == 2 and
          all(st == 200 and x["meta_info"]["finish_reason"]["type"] == "abort" for st, x in replies),
          f"abort_all: {status} {replies}")
    for body, want in [({"rid": "nothing-1"}, 404), ({}, 400), ({"rid": 5}, 400)]:
        status, r = s.post("/abort_request", body)
        check(status == want and r["error"]["param"] == "rid", f"/abort_request {body}: {status} {r}")
    for rid in ["", 7, "x" * 257]:
        status, r = s.post("/generate", {"input_ids": [1], "rid": rid})
        check(status == 400 and r["error"]["param"] == "rid", f"rid {rid!r}: {status} {r}")
    deadline = time.time() + 10
    while time.time() < deadline and s.metrics().get("dcp_num_running_reqs", 1) > 0:
        time.sleep(0.1)
    check(s.metrics().get("dcp_num_running_reqs") == 0, "nothing left running after the aborts")


def case_logprobs(s):
    status, r = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 3,
                                           "ignore_eos": True})
    lp = r["choices"][0]["logprobs"]
    check(status == 200 and len(lp["token_logprobs"]) == 6 and len(lp["top_logprobs"]) == 6, f"logprobs {lp}")
    check(all(x <= 0 for x in lp["token_logprobs"]), "logprobs are <= 0")
    check(all(len(t) <= 3 for t in lp["top_logprobs"]), "at most 3 alternatives")
    check(all(abs(max(t.values()) - x) < 1e-6 for t, x in zip(lp["top_logprobs"], lp["token_logprobs"])),
          "greedy picks the most likely token")
    status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                "temperature": 0, "logprobs": True, "top_logprobs": 2})
    content = r["choices"][0]["logprobs"]["content"]
    check(status == 200 and len(content) == r["usage"]["completion_tokens"], "chat logprobs per token")
    check(all(len(c["top_logprobs"]) == 2 and "bytes" in c for c in content), "chat top_logprobs")
    # return_tokens_as_token_ids: each token named "token_id:N", offsets still over the text.
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    status, plain = s.post("/v1/completions", body)
    status, r = s.post("/v1/completions", {**body, "return_tokens_as_token_ids": True})
    lp, ids = r["choices"][0]["logprobs"], r["choices"][0]["token_ids"]
    check(lp["tokens"] == [f"token_id:{t}" for t in ids], f"tokens as ids: {lp['tokens']} vs {ids}")
    check(all(k.startswith("token_id:") for t in lp["top_logprobs"] for k in t) and
          lp["text_offset"] == plain["choices"][0]["logprobs"]["text_offset"], f"top keys and offsets: {lp}")
    status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                                "temperature": 0, "logprobs": True, "top_logprobs": 2,
                                                "return_tokens_as_token_ids": True})
    content = r["choices"][0]["logprobs"]["content"]
    check(all(c["token"].startswith("token_id:") for c in content) and
          all(t["token"].startswith("token_id:") for c in content for t in c["top_logprobs"]), f"chat: {content}")


def case_errors(s):
    def expect(status_want, body, param=None, path="/v1/completions", raw=None):
        status, r = s.request("POST", path, body, raw=raw)
        what = repr(body or raw)[:120]
        check(status == status_want, f"{what}: status {status}, expected {status_want}: {r}")
        check(isinstance(r, dict) and "message" in r.get("error", {}), f"{what}: an OpenAI error body: {r}")
        if param and isinstance(r, dict) and "error" in r:
            check(r["error"].get("param") == param, f"{what}: param {r['error'].get('param')} != {param}")
    expect(400, None, raw="{not json")
    expect(400, None, raw="[1, 2]")
    expect(400, None, raw=b'{"pro\xffmpt": 1}')  # bytes that are not UTF-8, quoted in the error
    expect(400, {"prompt": 5, "max_tokens": 3}, "prompt")
    expect(400, {"prompt": "hi", "max_tokens": "3"}, "max_tokens")
    expect(400, {"prompt": "hi", "max_tokens": 0}, "max_tokens")
    expect(400, {"prompt": "hi", "temperature": -1}, "temperature")
    expect(400, {"prompt": "hi", "top_p": 1.5}, "top_p")
    expect(400, {"prompt": "hi", "n": 0}, "n")
    expect(400, {"prompt": "hi", "stop": 3}, "stop")
    expect(400, {"prompt": "hi", "stop": ""}, "stop")
    expect(400, {"prompt": "hi", "stop": ["ok", ""]}, "stop")
    expect(400, {"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty")
    expect(400, {"prompt": "hi", "frequency_penalty": "1"}, "frequency_penalty")
    expect(400, {"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty")
    expect(400, {"prompt": "hi", "logit_bias": {"abc": 1}}, "logit_bias")
    expect(400, {"prompt": "hi", "logit_bias": {" 7": 1}}, "logit_bias")
    expect(400, {"prompt": "hi", "logit_bias": {"+7": 1}}, "logit_bias")
    expect(400, {"prompt": "hi", "logit_bias": {"7": 101}}, "logit_bias")
    expect(400, {"prompt": "hi", "logit_bias": {"100000": 1}}, "logit_bias")
    expect(400, {"prompt": "hi", "logit_bias": [7]}, "logit_bias")
    expect(400, {"prompt": "hi", "min_tokens": -1}, "min_tokens")
    expect(400, {"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo", path="/v1/chat/completions")
    # vLLM's and SGLang's extensions that would change the result are refused, not ignored.
    for key, value in [("structural_tag", "{}"), ("use_beam_search", True)]:
        expect(400, {"prompt": "hi", key: value}, key)
    expect(400, {"text": "hi", "sampling_params": {"prompt_logprobs": 1}}, "prompt_logprobs", path="/generate")
    # Deep nesting is refused before the body is parsed (a parser copies deep objects by recursion).
    status, r = s.request("POST", "/v1/completions", raw='{"prompt": "hi", "x": ' + '{"a": ' * 100000 + "1" + "}" * 100001)
    check(status == 400 and "nests arrays and objects more than 300 levels" in r["error"]["message"], f"deep body: {status} {r}")
    expect(400, {"prompt": "hi", "allowed_token_ids": []}, "allowed_token_ids")
    expect(400, {"prompt": "hi", "allowed_token_ids": [3, 100000]}, "allowed_token_ids")
    expect(400, {"prompt": "hi", "allowed_token_ids": [9], "bad_words": ["\t"]}, "bad_words")
    expect(400, {"prompt": "hi", "bad_words": "hi"}, "bad_words")
    expect(400, {"prompt": "hi", "bad_words": [1]}, "bad_words")
    expect(400, {"prompt": "hi", "bad_words": ["x"] * 257}, "bad_words")
    expect(400, {"prompt": "hi", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens")
    expect(400, {"prompt": "hi", "guided_choice": ["red", "redder"]}, "guided_choice")
    expect(400, {"prompt": "hi", "guided_choice": []}, "guided_choice")
    expect(400, {"prompt": "hi", "guided_choice": ["red", ""]}, "guided_choice")
    expect(400, {"prompt": "hi", "guided_choice": "red"}, "guided_choice")
    expect(400, {"prompt": "hi", "guided_choice": ["red"], "allowed_token_ids": [1]}, "guided_choice")
    expect(400, {"prompt": "hi", "guided_regex": "(a"}, "guided_regex")
    expect(400, {"prompt": "hi", "guided_regex": ""}, "guided_regex")
    expect(400, {"prompt": "hi", "guided_regex": "a(?=b)"}, "guided_regex")
    expect(400, {"prompt": "hi", "guided_regex": "(" * 100000}, "guided_regex")  # nesting bounded
    expect(400, {"prompt": "hi", "guided_grammar": "root ::= " + "(" * 100000}, "guided_grammar")
    expect(400, {"prompt": "hi", "guided_regex": "a", "regex": "a"}, "regex")
    expect(400, {"prompt": "hi", "guided_regex": "a", "guided_choice": ["a"]}, "guided_regex")
    expect(400, {"text": "hi", "sampling_params": {"regex": "a{0}"}}, "regex", path="/generate")
    expect(400, {"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {}}}, "response_format")
    expect(400, {"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2.5}}}}}}, "response_format")
    expect(400, {"prompt": "hi", "guided_json": {"type": "object", "properties": {}}, "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "null"}}}}, "guided_json")
    expect(400, {"prompt": "hi", "guided_json": "{not json"}, "guided_json")
    expect(400, {"prompt": "hi", "guided_json": 5}, "guided_json")
    expect(400, {"prompt": "hi", "response_format": {"type": "xml"}}, "response_format")
    expect(400, {"prompt": "hi", "response_format": {"type": "json_object"}, "guided_regex": "a"}, "response_format")
    expect(400, {"prompt": "hi", "messages": []}, "prompt", path="/tokenize")
    expect(400, {}, "prompt", path="/tokenize")
    expect(400, {"prompt": [1, 2]}, "prompt", path="/tokenize")
    expect(400, {"messages": [{"content": "no role"}]}, "messages", path="/tokenize")
    expect(404, {"prompt": "hi", "model": "gpt-5"}, "model", path="/tokenize")
    expect(400, None, raw="[1]", path="/tokenize")
    expect(400, {"tokens": [1, 100000]}, "tokens", path="/detokenize")
    expect(400, {"tokens": [1, 450]}, "tokens", path="/detokenize")  # beyond the tokenizer's 319 ids
    expect(400, {"tokens": "1 2"}, "tokens", path="/detokenize")
    expect(400, {}, "tokens", path="/detokenize")
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    expect(400, {**chat, "continue_final_message": True}, "continue_final_message", path="/v1/chat/completions")
    expect(400, {**chat, "continue_final_message": True, "add_generation_prompt": False,
                 "chat_template": "{{ 'x' }}"}, "continue_final_message", path="/tokenize")
    expect(400, {**chat, "chat_template": "{% if %}"}, "chat_template", path="/v1/chat/completions")
    expect(400, {**chat, "chat_template": 3}, "chat_template", path="/tokenize")
    expect(400, {**chat, "chat_template_kwargs": [1]}, "chat_template_kwargs", path="/tokenize")
    expect(400, {**chat, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", path="/tokenize")
    expect(400, {**chat, "documents": {"title": "a"}}, "documents", path="/tokenize")
    expect(400, {"prompt": "hi", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens")
    expect(400, {"prompt": "hi", "allowed_token_ids": [9], "stop_token_ids": [9], "min_tokens": 1})
    expect(400, {"text": "hi", "sampling_params": {"json_schema": '{"not": {}}'}}, "json_schema", path="/generate")
    expect(400, {"text": "hi", "sampling_params": {"structural_tag": "{}"}}, "structural_tag", path="/generate")
    expect(400, {"text": "hi", "sampling_params": {"n": 17}}, "n", path="/generate")
    # SGLang's batches: the error names the field and, for one prompt's, the prompt.
    expect(400, {"text": []}, "text", path="/generate")
    expect(400, {"text": [["a"]]}, "text", path="/generate")
    expect(400, {"input_ids": [[[1]]]}, "input_ids", path="/generate")
    expect(400, {"input_ids": [[1], [2]], "sampling_params": [{}]}, "sampling_params", path="/generate")
    expect(400, {"input_ids": [[1], [2]], "return_logprob": [True, False, True]}, "return_logprob", path="/generate")
    status, r = s.post("/generate", {"input_ids": [[1], [2]], "sampling_params": [{}, {"temperature": -1}]})
    check(status == 400 and r["error"]["param"] == "temperature" and r["error"]["message"].startswith("prompt 1: "),
          f"a batch's second prompt at fault: {status} {r}")
    expect(400, {"text": "hi", "custom_logit_processor": "x"}, "custom_logit_processor", path="/generate")
    # Inputs and adapters this engine has no place for, and a JSON whitespace pattern: refused
    # unless empty.
    for key, value in [("image_data", "http://x/y.png"), ("input_embeds", [[0.1]]), ("lora_path", "adapter"),
                       ("return_hidden_states", True), ("session_params", {"id": "s"})]:
        expect(400, {"text": "hi", key: value}, key, path="/generate")
    expect(400, {"prompt": "hi", "prompt_embeds": "AAAA"}, "prompt_embeds")
    expect(400, {"prompt": "hi", "guided_json": {"type": "object"}, "guided_whitespace_pattern": "[ ]*"},
           "guided_whitespace_pattern")
    status, r = s.post("/generate", {"text": "hi", "image_data": [], "return_hidden_states": False, "lora_path": None,
                                     "sampling_params": {"max_new_tokens": 1}})
    check(status == 200, f"empty inputs ask for nothing: {status} {r}")
    expect(400, {"prompt": "hi", "priority": 1}, "priority")
    status, r = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 1, "bad_words": [], "use_beam_search": False,
                                           "priority": 0})
    check(status == 200, f"extensions that ask for nothing are accepted: {status} {r}")
    expect(400, {"prompt": "hi", "include_stop_str_in_output": 1}, "include_stop_str_in_output")
    expect(400, {"prompt": "hi", "min_tokens": 5, "max_tokens": 3})
    expect(400, {"text": "hi", "sampling_params": {"logit_bias": {"-1": 1}}}, "logit_bias", path="/generate")
    expect(400, {"prompt": [1, 2, 100000]}, "prompt")
    expect(400, {"prompt": [[1, 2], []]}, "prompt")
    expect(400, {"prompt": [[1, 2], [3, 100000]]}, "prompt")
    expect(400, {"prompt": [[1]] * 257}, "prompt")
    expect(400, {"prompt": "hi", "max_tokens": 10**6})
    expect(404, {"prompt": "hi", "model": "gpt-5"}, "model")
    expect(400, {"messages": []}, "messages", path="/v1/chat/completions")
    expect(400, {"messages": [{"content": "no role"}]}, "messages", path="/v1/chat/completions")
    expect(413, {"prompt": [i % 500 for i in range(5000)]})
    status, r = s.request("GET", "/v1/nothing")
    check(status == 404 and "error" in r, f"unknown route: {status} {r}")
    for method, path in [("POST", "/reset_prefix_cache"), ("POST", "/flush_cache"), ("GET", "/flush_cache")]:
        status, r = s.request(method, path, {})
        check(status == 400 and "--enable-prefix-cache" in r["error"]["message"],
              f"{method} {path} without the cache: {status} {r}")
    # Unknown fields are ignored; the server still serves after every error above.
    status, r = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2, "user": "x", "something_new": {"a": 1}})
    check(status == 200 and r["usage"]["completion_tokens"] <= 2, f"unknown fields ignored: {status} {r}")


def case_disconnect(s):
    """A client that goes away mid-reply, streamed or whole: its request ends and its KV is freed."""
    for stream in (True, False):
        sock = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps({"prompt": PROMPT, "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
                           "stream": stream})
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        if stream:
            got = b""
            while got.count(b"data: ") < 3:
                got += sock.recv(4096)
        else:  # a whole reply: wait until it runs and has made some tokens
            start = s.metrics()["dcp_generation_tokens_total"]
            deadline = time.time() + 10
            while time.time() < deadline and s.metrics()["dcp_generation_tokens_total"] < start + 3:
                time.sleep(0.02)
        before = s.metrics()
        check(before.get("dcp_num_running_reqs") == 1,
              f"stream {stream}: one request runs: {before.get('dcp_num_running_reqs')}")
        sock.close()
        deadline = time.time() + 10
        m = s.metrics()
        while time.time() < deadline and (m["dcp_num_running_reqs"] != 0 or m['dcp_kv_rows_used{rank="0"}'] != 0):
            time.sleep(0.05)
            m = s.metrics()
        check(m["dcp_num_running_reqs"] == 0, f"stream {stream}: the abandoned request stopped")
        check(m['dcp_kv_rows_used{rank="0"}'] == 0 and m['dcp_kv_rows_used{rank="1"}'] == 0,
              f"stream {stream}: its KV was freed")
        check(m['dcp_requests_total{outcome="cancelled"}'] > before['dcp_requests_total{outcome="cancelled"}'],
              f"stream {stream}: counted as cancelled")
        check(m["dcp_generation_tokens_total"] < before["dcp_generation_tokens_total"] + 900,
              f"stream {stream}: it did not run to the end")


def case_concurrent_streams(s):
    """64 clients stream at once; each gets the text a request alone gets (greedy)."""
    prompts = [[(7 * i + 3 * k) % 500 + 1 for k in range(5 + i % 17)] for i in range(64)]
    alone = {}
    for i in (0, 21, 42, 63):
        alone[i] = s.post("/v1/completions", {"prompt": prompts[i], "max_tokens": 12, "temperature": 0,
                                              "ignore_eos": True})[1]["choices"][0]["text"]
    got = {}

    def client(i):
        _, _, events = s.stream("/v1/completions", {"prompt": prompts[i], "max_tokens": 12, "temperature": 0,
                                                    "ignore_eos": True, "stream": True})
        got[i] = ("".join(e["choices"][0]["text"] for e in events[:-1]), events[-1] == "[DONE]")
    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(len(got) == 64 and all(done for _, done in got.values()), "all 64 streams complete")
    for i, text in alone.items():
        check(got[i][0] == text, f"stream {i} under load {got[i][0]!r} != alone {text!r}")
    # And every stream equals its own request run alone afterwards.
    for i in range(0, 64, 9):
        text = s.post("/v1/completions", {"prompt": prompts[i], "max_tokens": 12, "temperature": 0,
                                          "ignore_eos": True})[1]["choices"][0]["text"]
        check(got[i][0] == text, f"stream {i}: {got[i][0]!r} != {text!r}")


def case_idle_connections(s):
    """Connections that stay open and send nothing (a client's keep-alive pool, a socket opened
    early) hold no one else up: with 300 of them open (more than a fixed pool of 128 threads
    served), a request is answered while every one of them is still open, which a server that had
    to time them out first could not do. Closing them leaves the server as it was."""
    idle = [socket.create_connection(("127.0.0.1", s.port), timeout=60) for _ in range(300)]
    try:
        status, r = s.post("/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0})
        check(status == 200 and len(r["choices"][0]["token_ids"]) == 3, f"a request beside 300 idle sockets: {status} {r}")
        closed = 0
        for sock in idle:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""  # the server closed it (a read timeout)
            except BlockingIOError:
                pass  # open and silent, as a connection that holds no one up stays
        check(closed == 0, f"{closed} of the 300 idle sockets were closed before the request was answered")
        _, _, events = s.stream("/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0,
                                                    "stream": True})
        check(events[-1:] == ["[DONE]"], f"a stream beside 300 idle sockets: {events}")
        # A connection that waits for its next request sleeps until it comes: cpp-httplib's own
        # loop polled every 10 ms, 18000 thread wake-ups a second for 100 such connections.
        for sock in idle[:100]:
            sock.setblocking(True)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        for sock in idle[:100]:
            check(sock.recv(4096).startswith(b"HTTP/1.1 200"), "a kept-alive connection's /health")
        def switches():  # context switches of all the server's threads so far
            total = 0
            for task in os.listdir(f"/proc/{s.proc.pid}/task"):
                try:
                    with open(f"/proc/{s.proc.pid}/task/{task}/status") as f:
                        total += sum(int(l.split()[1]) for l in f if "ctxt_switches" in l)
                except FileNotFoundError:
                    pass  # a thread that just ended
            return total
        before = switches()
        time.sleep(1)
        woken = switches() - before
        check(woken < 2000, f"100 kept-alive connections woke the server {woken} times in a second")
    finally:
        for sock in idle:
            sock.close()
    status, _ = s.post("/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3})
    check(status == 200, f"after the idle sockets closed: {status}")
    # A socket each: the server lifts its soft limit on open files to the hard one.
    with open(f"/proc/{s.proc.pid}/limits") as f:
        soft, hard = next(l for l in f if l.startswith("Max open files")).split()[3:5]
    check(hard == "unlimited" or soft == hard, f"open files: soft limit {soft}, hard {hard}")


def case_pipelined_requests(s):
    """Requests a client sends one after another on one connection without waiting for the replies
    (HTTP/1.1 pipelining) are each answered, in order; cpp-httplib's own loop answered the first
    and dropped the rest it had read ahead."""
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    want = [s.post("/v1/completions", {"prompt": p, "max_tokens": 3, "temperature": 0})[1]["choices"][0]["token_ids"]
            for p in prompts]
    sent = b""
    for p in prompts:
        body = json.dumps({"prompt": p, "max_tokens": 3, "temperature": 0}).encode()
        sent += (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    sent += b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=120)
    sock.sendall(sent)
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    sock.close()
    replies = []  # (status, body) in order; whole replies carry Content-Length
    while got:
        head, _, rest = got.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = next(int(l.split(":")[1]) for l in lines if l.lower().startswith("content-length:"))
        replies.append((int(lines[0].split()[1]), rest[:length]))
        got = rest[length:]
    check([status for status, _ in replies] == [200] * 4, f"pipelined replies' statuses {replies}")
    ids = [json.loads(body)["choices"][0]["token_ids"] for _, body in replies[:3]]
    check(ids == want, f"pipelined completions {ids} != one at a time {want}")


def case_kept_alive_requests(s):
    """A client that sends its requests one after another on one connection (OpenAI's SDK does)
    keeps that connection: 40 requests, none answered with "Connection: close", all over the one
    socket (cpp-httplib's default closed it after the fifth)."""
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    body = json.dumps({"prompt": [5, 6, 7], "max_tokens": 1, "temperature": 0})
    sockets = set()
    for i in range(40):
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        sockets.add(conn.sock.getsockname())
        r = conn.getresponse()
        r.read()
        check(r.status == 200, f"kept-alive request {i}: status {r.status}")
        check((r.getheader("Connection") or "").lower() != "close",
              f"kept-alive request {i} answered with Connection: close")
    conn.close()
    check(len(sockets) == 1, f"40 kept-alive requests used {len(sockets)} connections")


def http_replies(data):
    """The (status, headers, body) of each whole reply in bytes read from one connection."""
    replies = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:]}
        length = int(headers["content-length"])
        replies.append((int(lines[0].split()[1]), headers, rest[:length]))
        data = rest[length:]
    return replies


def case_malformed_requests(s):
    """A request the server cannot read to its end (a header past the HTTP library's line limit, a
    broken chunked body) gets one 400 and the connection closes: what is left of it would be read
    as more requests (cpp-httplib answered the rest of a long header line with a second 400, which
    a kept-alive client would take for the reply to its next request). A pipelined request after
    it is not answered; the server goes on serving."""
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    for what, sent in [("a 20000-byte header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " +
                        b"a" * 20000 + b"\r\n\r\n"),
                       ("a broken chunked body", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n")]:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
        sock.sendall(sent + health)
        got = b""
        while chunk := sock.recv(65536):  # the server closes (60 s: far past its 5 s keep-alive)
            got += chunk
        sock.close()
        replies = http_replies(got)
        check([status for status, _, _ in replies] == [400], f"{what}: replies {replies}")
        check(replies and replies[0][1].get("connection") == "close",
              f"{what}: the 400 says Connection: close ({replies})")
        check(replies and "malformed" in json.loads(replies[0][2])["error"]["message"],
              f"{what}: the 400 says why ({replies})")
    status, _ = s.request("GET", "/health")
    check(status == 200, f"/health after malformed requests: {status}")


def case_bodyless_posts(s):
    """A POST with neither Content-Length nor Transfer-Encoding has an empty body (RFC 9112), as
    `curl -X POST URL` sends vLLM's POST /reset_prefix_cache: it is answered at once (not after
    the read timeout, with a 400), on a connection that goes on serving; an empty body to a route
    that reads JSON is that route's 400; an unknown path a 404, a GET path a 405."""
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"POST /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"POST /health HTTP/1.1\r\nHost: x\r\n\r\n"
                 b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    started, got = time.monotonic(), b""
    while len(http_replies(got)) < 4 and (chunk := sock.recv(65536)):
        got += chunk
    waited = time.monotonic() - started
    sock.close()
    replies = http_replies(got)
    check([status for status, _, _ in replies] == [400, 404, 405, 200], f"bodyless POSTs: {replies}")
    check(replies and "not JSON" in json.loads(replies[0][2])["error"]["message"],
          f"an empty body is the route's 400: {replies[:1]}")
    check(waited < 4, f"bodyless POSTs answered at once, not after the read timeout: {waited:.1f} s")
    # vLLM's documented call; this server has no prefix cache, which the route's 400 says.
    run = subprocess.run(["curl", "-s", "-X", "POST", f"http://127.0.0.1:{s.port}/reset_prefix_cache"],
                         capture_output=True, text=True, timeout=60) if shutil.which("curl") else None
    check(run is None or "prefix cache is off" in run.stdout, f"curl -X POST: {run and run.stdout}")


def case_metrics_and_models(s):
    status, r = s.request("GET", "/v1/models")
    check(status == 200 and r["data"][0]["id"] == CKPT, f"/v1/models {r}")
    status, one = s.request("GET", "/v1/models/" + CKPT)  # the name holds '/'
    check(status == 200 and one == r["data"][0], f"/v1/models/NAME {one} != {r['data'][0]}")
    status, one = s.request("GET", "/v1/models/gpt-5")
    check(status == 404 and one["error"]["param"] == "model", f"/v1/models/gpt-5: {status} {one}")
    status, _ = s.request("GET", "/health")
    check(status == 200, "/health")
    # A known path asked with another method: 405 and the methods it takes; an unknown one: 404.
    for method, path, allow in [("GET", "/v1/completions", "POST"), ("PUT", "/v1/models/x", "GET, HEAD"),
                                ("DELETE", "/health", "GET, HEAD")]:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request(method, path, "{}" if method == "PUT" else None)
        r = conn.getresponse()
        body = json.loads(r.read())
        conn.close()
        check(r.status == 405 and r.getheader("Allow") == allow and body["error"]["code"] == 405,
              f"{method} {path}: {r.status}, Allow {r.getheader('Allow')}, {body}")
    status, r = s.request("POST", "/v1/embeddings", {"input": "hi"})
    check(status == 404 and "no route" in r["error"]["message"], f"POST /v1/embeddings: {status} {r}")
    m = s.metrics()
    check(not any(k.startswith("dcp_spec_decode") for k in m), "no speculative metrics without a draft")
    for key in ["dcp_time_to_first_token_seconds_count", "dcp_inter_token_latency_seconds_count",
                'dcp_kv_rows_capacity{rank="1"}', "dcp_prompt_tokens_total", "dcp_num_queued_reqs",
                "dcp_prefix_cache_hit_tokens_total", 'dcp_prefix_cache_tokens{tier="host"}',
                "dcp_prefix_cache_offloaded_tokens_total", "dcp_prefix_cache_reloaded_tokens_total",
                "dcp_prefix_cache_dropped_tokens_total"]:
        check(key in m, f"/metrics has {key}")
    for h in ["dcp_time_to_first_token_seconds", "dcp_e2e_request_latency_seconds"]:
        check(m.get(h + '_bucket{le="+Inf"}') == m.get(h + "_count") is not None,
              f"{h}: its +Inf bucket equals its count")


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 8},
                                          "days": {"type": "integer"},
                                          "unit": {"enum": ["C", "F"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "now"}},
]


def valid_arguments(name, text):
    """A tool's arguments as its schema in TOOLS allows (the schema checked here by hand)."""
    args = json.loads(text)
    if name == "now":
        return args == {}
    return (isinstance(args, dict) and set(args) <= {"city", "days", "unit"} and isinstance(args.get("city"), str)
            and len(args["city"]) <= 8 and isinstance(args.get("days", 0), int) and args.get("unit", "C") in "CF")


def joined_stream(events):
    """A streamed chat reply's content, its tool calls assembled from their deltas, and its finish."""
    content, calls, finish = "", {}, None
    for e in events[:-1]:
        for c in e["choices"]:
            d = c["delta"]
            content += d.get("content") or ""
            for t in d.get("tool_calls", []):
                call = calls.setdefault(t["index"], {"id": None, "name": "", "arguments": ""})
                call["id"] = t.get("id", call["id"])
                call["name"] += t.get("function", {}).get("name", "")
                call["arguments"] += t.get("function", {}).get("arguments", "")
            finish = c["finish_reason"] or finish
    return content, [calls[k] for k in sorted(calls)], finish


def listed_calls(text):
    """A "required" reply's calls as Python's json reads its list item by item: (name, parameters)
    of each item read whole, and the content: None for a whole list, else the text after the last
    call read (all of it where none was)."""
    blank, decoder = " \t\n\r", json.JSONDecoder()
    calls, last = [], 0
    i = len(text) - len(text.lstrip(blank))
    if text[i:i + 1] != "[":
        return calls, text or None
    i += 1
    while True:
        while i < len(text) and text[i] in blank:
            i += 1
        try:
            item, end = decoder.raw_decode(text, i)
        except ValueError:
            break
        if not (isinstance(item, dict) and set(item) == {"name", "parameters"} and isinstance(item["name"], str)
                and isinstance(item["parameters"], dict)):
            break
        calls.append((item["name"], item["parameters"]))
        last = i = end
        while i < len(text) and text[i] in blank:
            i += 1
        if text[i:i + 1] == "]" and not text[i + 1:].strip(blank):
            return calls, None
        if text[i:i + 1] != ",":
            break
        i += 1
    return calls, (text[last:] if calls else text) or None


def flat_calls(message):
    return [{"id": t["id"], "name": t["function"]["name"], "arguments": t["function"]["arguments"]}
            for t in message.get("tool_calls", [])]


def case_tools():
    """OpenAI's tools on chat completions. "required" and a named function guide the reply to
    calls whose arguments are valid under each tool's schema; "auto" reads the calls the model
    writes in DeepSeek's or Kimi K2's format (forced here by a guided_regex, since the random model
    writes none itself), whole and streamed; "none" and tools the model does not call leave the
    content alone; the template sees the tools; refusals name their field."""
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    base = {"messages": messages, "temperature": 0, "max_tokens": 64}
    # The DeepSeek V3 format with two calls (as its chat template writes calls into a conversation),
    # and Kimi K2's with one; the markers are plain text to this small tokenizer.
    ds = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
          '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n'
          "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    ds_calls = [("get_weather", '{"city": "Paris", "days": 2}'), ("now", "{}")]
    kimi = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
            '{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>')
    s = Server("--tool-call-parser", "deepseek_v3")
    try:
        check("tool calls: deepseek_v3, reasoning: none)" in s.banner, f"the banner names the reader: {s.banner}")
        # none: the reply a chat without tools gets (this template does not render tools).
        status, plain = s.post("/v1/chat/completions", base)
        status2, r = s.post("/v1/chat/completions", {**base, "tools": TOOLS, "tool_choice": "none"})
        check(status == status2 == 200 and r["choices"][0]["message"] == plain["choices"][0]["message"]
              and "tool_calls" not in r["choices"][0]["message"], f"tool_choice none: {r} vs {plain}")
        # required: one call or more, each of a listed tool with valid arguments; sampled too.
        for extra in [{}, {"temperature": 1, "seed": 5, "n": 4}, {"parallel_tool_calls": False}]:
            status, r = s.post("/v1/chat/completions", {**base, "max_tokens": 200, "tools": TOOLS,
                                                        "tool_choice": "required", **extra})
            for c in r.get("choices", []):
                calls = flat_calls(c["message"])
                check(status == 200 and c["finish_reason"] == "tool_calls" and c["message"]["content"] is None
                      and len(calls) >= 1 and all(valid_arguments(t["name"], t["arguments"]) for t in calls)
                      and len({t["id"] for t in calls}) == len(calls)
                      and all("index" not in t for t in c["message"]["tool_calls"]), f"required {extra}: {c}")
                if "parallel_tool_calls" in extra:
                    check(len(calls) == 1, f"parallel_tool_calls false: one call: {calls}")
            check(status == 200 and len(r["choices"]) == extra.get("n", 1), f"required {extra}: {r}")
            if not extra:
                whole = r
        status, _, events = s.stream("/v1/chat/completions", {**base, "max_tokens": 200, "tools": TOOLS,
                                                              "tool_choice": "required", "stream": True})
        content, calls, finish = joined_stream(events)
        drop_id = lambda ts: [{k: t[k] for k in ("name", "arguments")} for t in ts]
        want = drop_id(flat_calls(whole["choices"][0]["message"]))
        check(content == "" and drop_id(calls) == want
              and finish == "tool_calls", f"required streamed: {calls} vs {want}")
        # Cut short by max_tokens at points across the reply: the calls whose object closed are
        # calls, the text after the last of them content (all of it with none), whole and streamed
        # alike, as Python's json reads the text the tokens spell item by item.
        written = whole["usage"]["completion_tokens"]
        for cut in sorted({1, written - 1} | set(range(4, written, max(1, written // 7)))):
            body = {**base, "max_tokens": cut, "tools": TOOLS, "tool_choice": "required"}
            status, r = s.post("/v1/chat/completions", body)
            c = r["choices"][0] if status == 200 else {"message": {}, "token_ids": []}
            _, text = s.post("/detokenize", {"tokens": c["token_ids"]})
            want_calls, want_content = listed_calls(text.get("prompt", ""))
            got = [(t["name"], json.loads(t["arguments"])) for t in flat_calls(c["message"])]
            check(status == 200 and c["finish_reason"] == "length" and got == want_calls
                  and c["message"]["content"] == want_content, f"required cut at {cut}: {text} -> {c}")
            status, _, events = s.stream("/v1/chat/completions", {**body, "stream": True})
            content, calls, finish = joined_stream(events)
            check(status == 200 and (content or None) == c["message"]["content"] and finish == "length"
                  and [(t["name"], t["arguments"]) for t in calls] == [(t["name"], t["arguments"]) for t in flat_calls(c["message"])],
                  f"required cut at {cut}, streamed: {content!r} {calls} vs {c['message']}")
        # A named function: its arguments, as the model wrote them, valid under its schema.
        named = {"type": "function", "function": {"name": "get_weather"}}
        status, r = s.post("/v1/chat/completions", {**base, "max_tokens": 200, "tools": TOOLS, "tool_choice": named})
        c = r["choices"][0] if status == 200 else {}
        calls = flat_calls(c.get("message", {}))
        check(status == 200 and c["finish_reason"] == "stop" and len(calls) == 1 and calls[0]["name"] == "get_weather"
              and valid_arguments("get_weather", calls[0]["arguments"]), f"named: {r}")
        status, _, events = s.stream("/v1/chat/completions", {**base, "max_tokens": 200, "tools": TOOLS,
                                                              "tool_choice": named, "stream": True})
        content, streamed, finish = joined_stream(events)
        deltas = [t for e in events[:-1] for t in e["choices"][0]["delta"].get("tool_calls", [])]
        check(drop_id(streamed) == drop_id(calls) and finish == "stop" and deltas and "id" in deltas[0]
              and all(set(t) == {"index", "function"} and set(t["function"]) == {"arguments"} for t in deltas[1:]),
              f"named streamed (the id and name first, then arguments as they come): {streamed} vs {calls}: {deltas}")
        # auto, the model writing DeepSeek V3's calls after some text: read whole and streamed.
        forced = {**base, "max_tokens": 400, "tools": TOOLS, "guided_regex": re.escape("Sure. " + ds)}
        status, r = s.post("/v1/chat/completions", forced)
        c = r["choices"][0] if status == 200 else {}
        check(status == 200 and c["finish_reason"] == "tool_calls" and c["message"]["content"] == "Sure. "
              and [(t["name"], t["arguments"]) for t in flat_calls(c["message"])] == ds_calls, f"auto: {r}")
        status, _, events = s.stream("/v1/chat/completions", {**forced, "stream": True})
        content, calls, finish = joined_stream(events)
        check(content == "Sure. " and [(t["name"], t["arguments"]) for t in calls] == ds_calls
              and finish == "tool_calls", f"auto streamed: {content!r} {calls} {finish}")
        check(all("<" not in (e["choices"][0]["delta"].get("content") or "") for e in events[:-1]),
              f"no piece of a marker is streamed as content: {events}")
        # parallel_tool_calls false: the first call only, whole and streamed.
        one = {**forced, "parallel_tool_calls": False}
        status, r1 = s.post("/v1/chat/completions", one)
        c = r1["choices"][0] if status == 200 else {"message": {}}
        status2, _, events1 = s.stream("/v1/chat/completions", {**one, "stream": True})
        content1, calls1, finish1 = joined_stream(events1)
        check(status == status2 == 200 and c["message"].get("content") == content1 == "Sure. "
              and [(t["name"], t["arguments"]) for t in flat_calls(c["message"])] == ds_calls[:1]
              and [(t["name"], t["arguments"]) for t in calls1] == ds_calls[:1]
              and c["finish_reason"] == finish1 == "tool_calls", f"auto, one call: {r1} {calls1}")
        # Cut short by max_tokens at points across the reply: the calls whose end marker was
        # written are calls, the text from the first non-blank byte after them content (all of it
        # where no call ended); the same streamed; finish_reason "length". What was written comes
        # from tool_choice "none".
        full = "Sure. " + ds
        call_ends = [m.end() for m in re.finditer(re.escape("<｜tool▁call▁end｜>"), full)]
        written = r["usage"]["completion_tokens"]
        for cut in sorted({1, 2, written - 1} | set(range(5, written, max(1, written // 9)))):
            status, plain = s.post("/v1/chat/completions", {**forced, "max_tokens": cut, "tool_choice": "none"})
            text = plain["choices"][0]["message"]["content"] if status == 200 else ""
            ended = [e for e in call_ends if e <= len(text)]
            want_content = text
            if ended:
                rest = text[ended[-1]:].lstrip(" \n")
                want_content = "Sure. " + ("" if rest == "<｜tool▁calls▁end｜>" else rest)
            want = {"content": want_content or None, "calls": ds_calls[:len(ended)]}
            status, r = s.post("/v1/chat/completions", {**forced, "max_tokens": cut})
            c = r["choices"][0] if status == 200 else {"message": {}}
            got = {"content": c["message"].get("content"),
                   "calls": [(t["name"], t["arguments"]) for t in flat_calls(c["message"])]}
            check(status == 200 and full.startswith(text.rstrip("\ufffd")) and c["finish_reason"] == "length" and got == want,
                  f"auto cut at {cut} tokens ({text!r}): {got} vs {want}")
            status, _, events = s.stream("/v1/chat/completions", {**forced, "max_tokens": cut, "stream": True})
            content, calls, finish = joined_stream(events)
            check(status == 200 and {"content": content or None, "calls": [(t["name"], t["arguments"]) for t in calls]}
                  == want and finish == "length", f"auto cut at {cut} tokens, streamed: {content!r} {calls} {finish}")
        # auto where the model calls nothing: its text, as without tools.
        status, r = s.post("/v1/chat/completions", {**base, "tools": TOOLS, "skip_special_tokens": False})
        status2, p2 = s.post("/v1/chat/completions", {**base, "skip_special_tokens": False})
        check(status == status2 == 200 and r["choices"][0]["message"] == p2["choices"][0]["message"],
              f"auto without a call: {r} vs {p2}")
        # The template sees the tools.
        status, r = s.post("/tokenize", {"messages": messages, "tools": TOOLS,
                                         "chat_template": "{% for t in tools %}{{ t.function.name }};{% endfor %}"})
        status2, want = s.post("/tokenize", {"prompt": "get_weather;now;", "add_special_tokens": False})
        check(status == 200 and r["tokens"] == want["tokens"], f"the template's tools: {r} vs {want}")
        # Refusals, each naming its field.
        for body, param in [({**base, "tool_choice": "required"}, "tool_choice"),
                            ({**base, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
                             "tool_choice"),
                            ({**base, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
                            ({**base, "tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
                            ({**base, "tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
                            ({**base, "tools": [TOOLS[1], TOOLS[1]]}, "tools"),
                            ({**base, "tools": [{"type": "code", "function": {"name": "a"}}]}, "tools"),
                            ({**base, "tools": [{"type": 1, "function": {"name": "a"}}]}, "tools"),
                            ({**base, "tools": TOOLS, "tool_choice": {"type": 5}}, "tool_choice"),
                            ({**base, "messages": [{"role": "user", "content": [{"type": 3}]}]}, "messages"),
                            ({**base, "tools": [{"type": "function", "function": {"name": "a", "parameters": {
                                "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2.5}}}}}],
                              "tool_choice": "required"}, "tools"),
                            ({"prompt": "x", "tools": TOOLS}, "tools"),
                            ({**base, "functions": [{"name": "f"}]}, "functions")]:
            path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
            status, r = s.post(path, body)
            check(status == 400 and r["error"]["param"] == param, f"refused naming {param}: {body} -> {status} {r}")
        status, r = s.post("/v1/chat/completions", {**base, "tools": [{"type": "function", "function": {
            "name": "a", "parameters": {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2.5}}}}}],
            "tool_choice": "required"})
        check("tools[0].function.parameters" in r.get("error", {}).get("message", ""),
              f"the schema's fault is placed: {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")
    s = Server("--tool-call-parser", "kimi_k2")
    try:
        status, r = s.post("/v1/chat/completions", {**base, "max_tokens": 300, "tools": TOOLS,
                                                    "guided_regex": re.escape(kimi)})
        c = r["choices"][0] if status == 200 else {}
        check(status == 200 and c["finish_reason"] == "tool_calls" and c["message"]["content"] is None
              and flat_calls(c["message"]) == [{"id": "functions.get_weather:0", "name": "get_weather",
                                                "arguments": '{"city": "Oslo"}'}], f"Kimi K2 auto: {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")
    # This tokenizer has neither format's tokens: "auto" (the default with tools) is refused.
    s = Server()
    try:
        check("tool calls: required or named only" in s.banner, f"the banner says auto is not read: {s.banner}")
        status, r = s.post("/v1/chat/completions", {**base, "tools": TOOLS})
        check(status == 400 and r["error"]["param"] == "tool_choice" and "--tool-call-parser" in r["error"]["message"],
              f"auto without a parser: {r}")
        status, r = s.post("/v1/chat/completions", {**base, "max_tokens": 200, "tools": TOOLS, "tool_choice": "required"})
        check(status == 200 and r["choices"][0]["finish_reason"] == "tool_calls", f"required without a parser: {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")


def case_reasoning():
    """--reasoning-parser: a chat reply's thinking comes back as reasoning_content. The random
    model never writes "</think>", so all its text is thinking (content null), whole and
    streamed, and a guide (which holds only what follows "</think>") leaves it free;
    include_reasoning false leaves it out; deepseek_v3 splits only in thinking mode (the split of
    replies that close their thinking is tested in test_reply_parsers, the guide after the marker
    in test_guided)."""
    base = {"messages": [{"role": "user", "content": "2 + 2?"}], "temperature": 0, "max_tokens": 24}
    s = Server("--reasoning-parser", "deepseek_r1")
    try:
        status, plain = s.post("/v1/chat/completions", base)
        m = plain["choices"][0]["message"] if status == 200 else {}
        check(status == 200 and "</think>" not in m.get("reasoning_content", "</think>")
              and m["content"] is None and len(m["reasoning_content"]) > 0, f"all thinking: {plain}")
        status, _, events = s.stream("/v1/chat/completions", {**base, "stream": True})
        deltas = [e["choices"][0]["delta"] for e in events[:-1]]
        check("".join(d.get("reasoning_content", "") for d in deltas) == m.get("reasoning_content")
              and "".join(d.get("content") or "" for d in deltas) == "", f"streamed thinking: {deltas}")
        status, r = s.post("/v1/chat/completions", {**base, "include_reasoning": False})
        check(status == 200 and "reasoning_content" not in r["choices"][0]["message"]
              and r["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"], f"include_reasoning false: {r}")
        # A guide holds only what follows "</think>": this reply never gets there, so it is free.
        for guide in [{"guided_regex": "[a-z]+"}, {"response_format": {"type": "json_object"}},
                      {"tools": TOOLS, "tool_choice": "required"}]:
            status, r = s.post("/v1/chat/completions", {**base, **guide})
            check(status == 200 and r["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
                  and r["choices"][0]["message"]["reasoning_content"] == m.get("reasoning_content")
                  and r["choices"][0]["message"]["content"] is None
                  and "tool_calls" not in r["choices"][0]["message"], f"guided thinking is free: {guide}: {r}")
        status, r = s.post("/v1/completions", {"prompt": "2 + 2?", "temperature": 0, "max_tokens": 24})
        check(status == 200 and "reasoning_content" not in r["choices"][0], f"completions are text: {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")
    s = Server("--reasoning-parser", "deepseek_v3")
    try:
        status, r = s.post("/v1/chat/completions", base)
        m2 = r["choices"][0]["message"] if status == 200 else {}
        check(status == 200 and "reasoning_content" not in m2 and m2["content"] == m.get("reasoning_content"),
              f"deepseek_v3 without thinking: content: {r}")
        status, r = s.post("/v1/chat/completions", {**base, "chat_template_kwargs": {"thinking": True}})
        m3 = r["choices"][0]["message"] if status == 200 else {}
        check(status == 200 and m3.get("content", "") is None and len(m3.get("reasoning_content", "")) > 0,
              f"deepseek_v3 thinking: {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")
    # Kimi-K2-Thinking's: thinking unless the request turns it off.
    s = Server("--reasoning-parser", "kimi_k2")
    try:
        status, r = s.post("/v1/chat/completions", base)
        m4 = r["choices"][0]["message"] if status == 200 else {}
        check(status == 200 and m4.get("content", "") is None and m4.get("reasoning_content") == m.get("reasoning_content"),
              f"kimi_k2 thinks by default: {r}")
        status, r = s.post("/v1/chat/completions", {**base, "chat_template_kwargs": {"thinking": False}})
        m5 = r["choices"][0]["message"] if status == 200 else {}
        check(status == 200 and "reasoning_content" not in m5 and m5["content"] == m.get("reasoning_content"),
              f"kimi_k2 without thinking: content: {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")


def case_chat_template():
    """--chat-template FILE: chat requests render the file's template, not the checkpoint's."""
    path = os.path.join(TMP, "template.jinja")
    with open(path, "w") as f:
        f.write("{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}### assistant:{% endif %}")
    messages = [{"role": "user", "content": "Name a color."}]

    def ids(*flags):
        out = subprocess.run([DCP, "tokenize", "--tokenizer-path", CKPT, "--chat", "--add-generation-prompt", *flags],
                             input=json.dumps(messages), capture_output=True, text=True, check=True).stdout
        return json.loads(out)
    want, own = ids("--chat-template", path), ids()
    check(want != own, "the file's template renders another prompt than the checkpoint's")
    s = Server("--chat-template", path)
    try:
        status, r = s.post("/v1/chat/completions", {"messages": messages, "max_tokens": 4, "temperature": 0})
        check(status == 200 and r["usage"]["prompt_tokens"] == len(want),
              f"the chat prompt is the file's template's ({len(want)} tokens): {status} {r}")
        status, g = s.post("/generate", {"input_ids": want, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
        check(status == 200 and g["text"] == r["choices"][0]["message"]["content"],
              f"the chat reply is the reply to the file's prompt: {g} {r}")
        status, t = s.post("/tokenize", {"messages": messages})
        check(status == 200 and t["tokens"] == want, f"/tokenize renders the file's template: {t}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")
    # A tokenizer folder with chat_template.jinja, as Kimi K2 ships it (macros, a loop that
    # breaks): that file is the template, over tokenizer_config.json's.
    kimi = os.path.join(TMP, "kimi_tokenizer")
    os.makedirs(kimi, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(CKPT, name), kimi)
    with open(os.path.join(kimi, "chat_template.jinja"), "w") as f:
        f.write("{%- macro head(m) -%}<{{ m.get('name') or m.role }}>{%- endmacro -%}\n"
                "{%- set ns = namespace(last=-1) -%}\n"
                "{%- for i in range(messages | length - 1, -1, -1) -%}{%- if messages[i].role == 'user' -%}"
                "{%- set ns.last = i -%}{%- break -%}{%- endif -%}{%- endfor -%}\n"
                "{%- for m in messages -%}{{ head(m) }}{{ m.content }}{{ '!' if loop.index0 == ns.last }}{%- endfor -%}\n"
                "{%- if add_generation_prompt -%}<assistant>{%- endif -%}\n")
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
             {"role": "user", "name": "ann", "content": "Name a color."}]
    plain = subprocess.run([DCP, "tokenize", "--tokenizer-path", CKPT], capture_output=True, text=True, check=True,
                           input="<user>Hi<assistant>Yo<ann>Name a color.!<assistant>").stdout
    s = Server("--tokenizer-path", kimi)
    try:
        status, t = s.post("/tokenize", {"messages": turns})
        check(status == 200 and t["tokens"] == json.loads(plain), f"chat_template.jinja renders the chat: {t}")
        status, r = s.post("/v1/chat/completions", {"messages": turns, "max_tokens": 2, "temperature": 0})
        check(status == 200 and r["usage"]["prompt_tokens"] == len(json.loads(plain)), f"and the chat runs: {status} {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")
    # A template dcp cannot run: the server says so at startup, refuses chats naming the construct
    # and serves completions.
    with open(os.path.join(kimi, "chat_template.jinja"), "w") as f:
        f.write("{% filter upper %}x{% endfilter %}")
    s = Server("--tokenizer-path", kimi)
    try:
        status, r = s.post("/v1/chat/completions", {"messages": turns, "max_tokens": 2})
        check(status == 400 and "'{% filter %}' is not supported" in r["error"]["message"], f"a chat: {status} {r}")
        status, r = s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        check(status == 200, f"a completion: {status} {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")
    with open(os.path.join(TMP, "server.log")) as f:
        log = f.read()
    check("warning: the chat template of" in log and "chat requests will be refused" in log,
          f"the startup warning: {log}")


def case_prefix_cache():
    """--enable-prefix-cache: a prompt an earlier one began reuses its KV, and the usage says how
    much: prompt_tokens_details.cached_tokens (and /generate's meta_info.cached_tokens) count the
    whole widened pages (page size x DCP size) of the longest cached prefix shorter than the prompt,
    and move the server's own hit counter by as much; greedy tokens are those of the first. The
    choices of a new prompt compute it once; a conversation's next turn finds the reply cached;
    POST /reset_prefix_cache empties it."""
    page, dcp = 16, 2
    widened = page * dcp
    s = Server("--tp-size", "2", "--dcp-size", str(dcp), "--page-size", str(page), "--enable-prefix-cache",
               "--max-total-tokens", "4096")
    try:
        prompt = [(7 * k * k + 3 * k + 11) % 500 + 1 for k in range(150)]
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        hits = lambda: s.metrics()["dcp_prefix_cache_hit_tokens_total"]
        before = hits()
        status, first = s.post("/v1/completions", body)
        check(status == 200 and first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0},
              f"a first prompt finds nothing cached: {first.get('usage')}")
        want = (len(prompt) - 1) // widened * widened  # 128
        # The cache holds the pages of the prompt and the reply but its last token: 157 tokens.
        held = lambda: s.metrics()['dcp_prefix_cache_tokens{tier="device"}']
        check(held() == (len(prompt) + 8 - 1) // widened * widened,
              f"the cache holds the first request's whole pages: {held()}")
        for label, extra, prompts in [("again", {}, 1), ("two choices", {"n": 2}, 2)]:
            before = hits()
            status, r = s.post("/v1/completions", {**body, **extra})
            got = r["usage"]["prompt_tokens_details"]["cached_tokens"] if status == 200 else None
            check(got == want and hits() - before == want * prompts
                  and all(c["token_ids"] == first["choices"][0]["token_ids"] for c in r["choices"]),
                  f"{label}: cached {got}, hits moved {hits() - before}, want {want} per choice: {r}")
        # /generate scoring the prompt from a late position takes the cached pages before it, and
        # its logprobs are those of the prompt computed whole (echo).
        status, echo = s.post("/v1/completions", {**body, "max_tokens": 0, "echo": True, "logprobs": 0})
        whole = echo["choices"][0]["logprobs"]["token_logprobs"] if status == 200 else []
        status, r = s.post("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1},
                                         "return_logprob": True, "logprob_start_len": 140})
        meta = r.get("meta_info", {}) if status == 200 else {}
        scored = [e[0] for e in meta.get("input_token_logprobs", [])]
        check(meta.get("cached_tokens") == want and len(scored) == 10 and
              all(abs(a - b) < 1e-4 for a, b in zip(scored, whole[140:])),
              f"logprob_start_len 140: cached {meta.get('cached_tokens')} (want {want}), {scored} != {whole[140:]}")
        # A new prompt with three choices: the first computes it, the other two wait for its pages
        # and reuse them (usage counts the prompt once, as its first choice found the cache); each
        # choice is the request alone with its seed.
        fresh = [(11 * k + 5) % 450 + 3 for k in range(150)]
        sampled = {**body, "prompt": fresh, "temperature": 0.8, "seed": 5}
        before = hits()
        status, r = s.post("/v1/completions", {**sampled, "n": 3})
        moved = hits() - before
        check(status == 200 and r["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
              and moved == 2 * want, f"three choices of a new prompt: hits moved {moved}, want {2 * want}: {r}")
        for i in range(3):
            status, one = s.post("/v1/completions", {**sampled, "seed": 5 + i})
            check(status == 200 and one["choices"][0]["token_ids"] == r["choices"][i]["token_ids"],
                  f"choice {i} is the request alone with seed {5 + i}: {one} against {r}")
        # A prompt sharing 100 tokens: the pages those fill.
        other = prompt[:100] + [(k * 13) % 400 + 2 for k in range(40)]
        before = hits()
        status, _, events = s.stream("/v1/completions", {**body, "prompt": other, "stream": True,
                                                          "stream_options": {"include_usage": True}})
        usage = events[-2].get("usage", {}) if status == 200 else {}
        check(usage.get("prompt_tokens_details") == {"cached_tokens": 100 // widened * widened}
              and hits() - before == 100 // widened * widened, f"a shared prefix, streamed: {usage}")
        status, g = s.post("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4,
                                                                                 "temperature": 0}})
        check(status == 200 and g["meta_info"]["cached_tokens"] == want, f"/generate: {g}")
        # A conversation's next turn: the first turn's prompt and reply are cached (but the reply's
        # last token, which never entered the KV), not the prompt alone.
        turn = [(17 * k + 9) % 430 + 4 for k in range(100)]
        status, r1 = s.post("/v1/completions", {**body, "prompt": turn, "max_tokens": 40})
        reply = r1["choices"][0]["token_ids"] if status == 200 else []
        following = turn + reply + [(k * 7) % 300 + 5 for k in range(10)]
        before = hits()
        status, r2 = s.post("/v1/completions", {**body, "prompt": following})
        written = (len(turn) + len(reply) - 1) // widened * widened  # 128; the prompt's alone: 96
        check(len(reply) == 40 and status == 200
              and r2["usage"]["prompt_tokens_details"] == {"cached_tokens": written}
              and hits() - before == written, f"the next turn finds the reply cached: {r2.get('usage')}")
        # POST /reset_prefix_cache: the next request finds nothing cached, the one after it again;
        # the cache then holds that prompt's pages alone.
        before = held()
        status, r = s.post("/reset_prefix_cache", {})
        check(status == 200 and r == {}, f"reset: {status} {r}")
        for label, cached in [("after the reset", 0), ("once more", want)]:
            status, r = s.post("/v1/completions", body)
            check(status == 200 and r["usage"]["prompt_tokens_details"] == {"cached_tokens": cached}
                  and r["choices"][0]["token_ids"] == first["choices"][0]["token_ids"],
                  f"{label}: {r.get('usage')}")
        check(before > 128 and held() == 128, f"cached tokens: {before} before the reset, {held()} after")
        # SGLang's /flush_cache (GET or POST) is the same reset: the next request finds nothing.
        for method in ["GET", "POST"]:
            s.post("/v1/completions", body)
            status, r = s.request(method, "/flush_cache")
            status2, r2 = s.post("/v1/completions", body)
            check(status == 200 and status2 == 200 and r2["usage"]["prompt_tokens_details"] == {"cached_tokens": 0},
                  f"{method} /flush_cache: {status} {r}, then {r2.get('usage')}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")


def case_checkpoint_eos():
    """A checkpoint's generation_config.json eos_token_id ends a request as the tokenizer's EOS
    does (Kimi's end of turn is not its eos_token): the greedy reply stops at its first such
    token, finish_reason stop; ignore_eos runs on."""
    prompt = [5, 17, 9, 33]
    ids = run_tokens(prompt, 8)  # greedy, through any EOS
    eos = ids[3]
    tokenizer_eos = json.loads(subprocess.run([DCP, "tokenize", "--tokenizer-path", CKPT], input="</s>",
                                              capture_output=True, text=True, check=True).stdout)[0]
    k = min(j for j, t in enumerate(ids) if t in (eos, tokenizer_eos))  # the reply ends there
    own = os.path.join(TMP, "ckpt_with_eos")
    shutil.copytree(CKPT, own, dirs_exist_ok=True)
    with open(os.path.join(own, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [eos], "max_length": 4096}, f)
    s = Server(model=own)
    try:
        status, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0})
        c = r["choices"][0]
        check(status == 200 and c["token_ids"] == ids[:k + 1] and c["finish_reason"] == "stop",
              f"stops at the checkpoint's EOS {eos}: {r} (alone: {ids})")
        status, r = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                               "ignore_eos": True})
        c = r["choices"][0]
        check(status == 200 and c["token_ids"] == ids and c["finish_reason"] == "length",
              f"ignore_eos runs on: {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")


def case_generation_config():
    """--generation-config auto (the default): a request that leaves out a sampling field takes the
    checkpoint's generation_config.json value, as vLLM does; a field the request sets wins; vllm:
    the API's defaults."""
    prompt = [5, 17, 9, 33]
    greedy = run_tokens(prompt, 8)
    own = os.path.join(TMP, "ckpt_with_sampling")
    shutil.copytree(CKPT, own, dirs_exist_ok=True)
    with open(os.path.join(own, "generation_config.json"), "w") as f:
        json.dump({"top_k": 1, "do_sample": True}, f)
    body = {"prompt": prompt, "max_tokens": 8, "seed": 5, "ignore_eos": True}
    s = Server(model=own)
    try:
        status, r = s.post("/v1/completions", body)
        check(status == 200 and r["choices"][0]["token_ids"] == greedy,
              f"top_k 1 from generation_config.json samples the greedy tokens: {r} {greedy}")
        status, r = s.post("/v1/completions", {**body, "top_k": 0})
        overridden = r["choices"][0]["token_ids"]
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")
    with open(os.path.join(TMP, "server.log")) as f:
        log = f.read()
    check("sample with the checkpoint's generation_config.json: top_k 1" in log, f"the startup note: {log}")
    s = Server("--generation-config", "vllm", model=own)
    try:
        status, r = s.post("/v1/completions", body)
        check(status == 200 and r["choices"][0]["token_ids"] == overridden,
              f"vllm: the API's defaults, as a request setting top_k 0 gets under auto: {r} {overridden}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")


def case_minicpm3():
    """A MiniCPM3 checkpoint (dense MLA, LongRoPE, muP scaling, a SentencePiece-style vocabulary
    with byte fallback) served from text: the prompt's ids are /tokenize's, the greedy reply is
    `dcp run`'s for them, its text continues the prompt's decoded text as vLLM's incremental
    detokenizer writes it (the piece's leading space kept), and chat and non-ASCII text round-trip."""
    model = os.path.join(TMP, "minicpm3")
    subprocess.run([DCP, "gen-checkpoint", "--family", "minicpm3", "--out", model], check=True,
                   stdout=subprocess.DEVNULL)
    text = "the cat sat in the hat"
    s = Server("--tp-size", "2", "--dcp-size", "2", model=model)
    try:
        status, tok = s.post("/tokenize", {"prompt": text})
        ids = tok["tokens"]
        check(status == 200 and ids[0] == 1 and len(ids) < len(text),
              f"BOS and merged pieces from the SentencePiece vocabulary: {tok}")
        status, r = s.post("/v1/completions", {"prompt": text, "max_tokens": 8, "temperature": 0,
                                               "ignore_eos": True})
        c = r["choices"][0]
        out = os.path.join(TMP, "minicpm3_run.json")
        subprocess.run([DCP, "run", "--model-path", model, "--prompt-tokens", ",".join(map(str, ids)),
                        "--max-new-tokens", "8", "--no-verify", "--json", out], check=True,
                       stdout=subprocess.DEVNULL)
        with open(out) as f:
            want = json.load(f)["requests"][0]["output_tokens"]
        check(status == 200 and c["token_ids"] == want, f"greedy tokens {r} != dcp run's {want}")
        _, whole = s.post("/detokenize", {"tokens": ids + c["token_ids"]})
        _, prompt = s.post("/detokenize", {"tokens": ids})
        check(whole["prompt"] == prompt["prompt"] + c["text"],
              f"the reply's text {c['text']!r} continues the prompt's {prompt['prompt']!r}: {whole['prompt']!r}")
        check(prompt["prompt"] == "<s> " + text,
              f"the prompt decodes back: {prompt}")
        odd = "héllo wörld 🙂 深度 x"
        _, r = s.post("/tokenize", {"prompt": odd, "add_special_tokens": False})
        _, back = s.post("/detokenize", {"tokens": r["tokens"]})
        check(back["prompt"] == odd, f"byte fallback round-trips {odd!r}: {r} -> {back}")
        status, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}],
                                                    "max_tokens": 4, "temperature": 0})
        check(status == 200 and r["usage"]["completion_tokens"] >= 1
              and isinstance(r["choices"][0]["message"]["content"], str), f"a chat reply: {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")
    # MiniCPM3's thought and Python tool calls (forced by a guided_regex: the random model writes
    # none itself): the thought is reasoning_content, the calls tool_calls with their values as
    # JSON, the rest content, whole and streamed; a reply that does not open a thought is content.
    reply = ("<|thought_start|>\nI need the weather.\n<|thought_end|>\n<|tool_call_start|>\n```python\n"
             "get_weather(city='Paris', days=2)\nnow()\n```\n<|tool_call_end|>\nOne moment.")
    calls = [("get_weather", '{"city": "Paris", "days": 2}'), ("now", "{}")]
    s = Server("--tool-call-parser", "minicpm3", "--reasoning-parser", "minicpm3", model=model)
    try:
        check("tool calls: minicpm3, reasoning: minicpm3)" in s.banner, f"the banner: {s.banner}")
        forced = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
                  "temperature": 0, "max_tokens": 400, "guided_regex": re.escape(reply)}
        status, r = s.post("/v1/chat/completions", forced)
        c = r["choices"][0] if status == 200 else {"message": {}}
        check(status == 200 and c["finish_reason"] == "tool_calls"
              and c["message"].get("reasoning_content") == "\nI need the weather.\n"
              and c["message"]["content"] == "\n\nOne moment."
              and [(t["name"], t["arguments"]) for t in flat_calls(c["message"])] == calls, f"minicpm3 auto: {r}")
        status, _, events = s.stream("/v1/chat/completions", {**forced, "stream": True})
        content, streamed, finish = joined_stream(events)
        thought = "".join(e["choices"][0]["delta"].get("reasoning_content", "") for e in events[:-1])
        check(status == 200 and content == "\n\nOne moment." and thought == "\nI need the weather.\n"
              and [(t["name"], t["arguments"]) for t in streamed] == calls and finish == "tool_calls",
              f"minicpm3 auto streamed: {content!r} {thought!r} {streamed} {finish}")
        plain = {**forced, "guided_regex": "Hi there"}
        status, r = s.post("/v1/chat/completions", plain)
        m = r["choices"][0]["message"] if status == 200 else {}
        check(status == 200 and m.get("content") == "Hi there" and not m.get("reasoning_content")
              and "tool_calls" not in m, f"no thought, no call: content: {r}")
        # A past call's arguments come as OpenAI sends them, a JSON string; a template that reads
        # them as a mapping (MiniCPM3's tool template does) gets them parsed, as vLLM parses them,
        # and a string that is no JSON object is refused by name.
        mapping = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name }}("
                   "{% for k, v in c.function.arguments|items %}{{ k }}={{ v|tojson }};{% endfor %})"
                   "{% endfor %}{{ m.content or '' }}|{% endfor %}")
        history = [{"role": "user", "content": "Weather?"},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"id": "c1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris","days":2}'}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
        status, got = s.post("/tokenize", {"messages": history, "chat_template": mapping})
        _, want = s.post("/tokenize", {"prompt": 'Weather?|get_weather(city="Paris";days=2;)|sunny|',
                                       "add_special_tokens": False})
        check(status == 200 and got["tokens"] == want["tokens"], f"arguments as a mapping: {got} vs {want}")
        history[1]["tool_calls"][0]["function"]["arguments"] = "[1]"
        status, r = s.post("/v1/chat/completions", {"messages": history, "chat_template": mapping,
                                                    "max_tokens": 1})
        check(status == 400 and r["error"]["param"] == "messages"
              and "messages[1].tool_calls[0].function.arguments must be a JSON object, not array"
              in r["error"]["message"], f"arguments no template can read: {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")


def case_disaggregate():
    """--disaggregate: a prefill group of DCP 1 computes prompts, their KV moves to the decode group
    (TP 2 x DCP 2), which finishes them: greedy tokens are dcp run's undivided; seeded sampling,
    logprobs, the prompt's logprobs (echo) and a stop token at the first token are what the
    undivided server gives; the KV of every rank is free afterwards; 16 clients at once each get
    the text of their request alone."""
    flags = ("--tp-size", "2", "--dcp-size", "2", "--max-total-tokens", "512")
    bodies = [
        {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True},
        {"prompt": PROMPT, "max_tokens": 12, "temperature": 0.9, "top_k": 30, "seed": 3, "logprobs": 2,
         "ignore_eos": True},
        {"prompt": PROMPT[:5], "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 1, "ignore_eos": True},
        {"prompt": PROMPT[:2], "max_tokens": 1, "temperature": 0, "ignore_eos": True},
    ]
    undivided = Server(*flags)
    try:
        want = [undivided.post("/v1/completions", b)[1]["choices"][0] for b in bodies]
        first = want[0]["token_ids"][0]
        stop_body = {**bodies[0], "stop_token_ids": [first]}
        want.append(undivided.post("/v1/completions", stop_body)[1]["choices"][0])
    finally:
        undivided.stop()
    bodies.append(stop_body)
    s = Server("--disaggregate", "--prefill-dcp-size", "1", *flags)
    try:
        check("3 ranks, prefill DCP 1 + decode TP 2, DCP 2" in s.banner, f"banner: {s.banner}")
        run = run_tokens(PROMPT, 16, "--tp-size", "2", "--dcp-size", "2")
        for body, w in zip(bodies, want):
            status, r = s.post("/v1/completions", body)
            c = r["choices"][0] if status == 200 else {}
            same = c.get("token_ids") == w["token_ids"] and c.get("finish_reason") == w["finish_reason"]
            lp, wlp = c.get("logprobs"), w["logprobs"]
            if wlp:
                same = same and lp["tokens"] == wlp["tokens"] and all(
                    (a is None and b is None) or abs(a - b) < 1e-4
                    for a, b in zip(lp["token_logprobs"], wlp["token_logprobs"]))
            check(same, f"disaggregated {body}: {r} against {w}")
        check(want[0]["token_ids"] == run, f"undivided server {want[0]['token_ids']} != dcp run {run}")
        check(want[-1]["token_ids"] == [first] and want[-1]["finish_reason"] == "stop",
              f"a stop token as the first token: {want[-1]}")
        status, _, events = s.stream("/v1/completions", {**bodies[0], "stream": True})
        streamed = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
        check(status == 200 and events[-1] == "[DONE]" and streamed == want[0]["text"],
              f"a disaggregated stream gives the whole reply's text: {streamed!r} against {want[0]['text']!r}")
        got = {}

        def client(i):
            body = {"prompt": PROMPT[i % 7:] + [i + 1], "max_tokens": 6 + i % 5, "temperature": 0,
                    "ignore_eos": True}
            got[i] = (body, s.post("/v1/completions", body))
        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(16):
            body, (status, r) = got[i]
            alone = s.post("/v1/completions", body)[1]
            check(status == 200 and r["choices"][0]["token_ids"] == alone["choices"][0]["token_ids"],
                  f"client {i} at once {r} against alone {alone}")
        for _ in range(100):  # the last step's report may still be on its way
            rows = [v for k, v in s.metrics().items() if k.startswith("dcp_kv_rows_used")]
            if all(v == 0 for v in rows):
                break
            time.sleep(0.02)
        check(len(rows) == 3 and all(v == 0 for v in rows), f"every rank's KV is free: {rows}")
        m = s.metrics()
        moved = m.get("dcp_disagg_kv_transfers_total")
        # Every request but the one-token and the stop-at-once ones moved: 3 + 1 + 16 + 16 alone.
        check(moved == len(bodies) - 2 + 1 + 32 and m.get("dcp_disagg_kv_transfer_bytes_total", 0) > 0
              and m.get("dcp_disagg_awaiting_transfer") == 0, f"transfer metrics: {m}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")


def case_speculative_sampling():
    """--speculative-num-draft-tokens serves sampled requests (speculative sampling): with the whole
    target as its draft every draft is kept and a seeded request's tokens are the plain server's;
    with its first layer, or n-gram lookup (no draft model), sampled and greedy requests are
    served, greedy ones as dcp run decodes them."""
    flags = ("--tp-size", "2", "--dcp-size", "2")
    body = {"prompt": PROMPT, "max_tokens": 14, "temperature": 0.9, "top_p": 0.95, "seed": 11,
            "logprobs": 1, "ignore_eos": True}
    gen = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 14, "temperature": 0.9, "top_p": 0.95,
                                               "seed": 11, "ignore_eos": True}}
    plain = Server(*flags)
    try:
        want = plain.post("/v1/completions", body)[1]["choices"][0]["token_ids"]
        status, g = plain.post("/generate", gen)
        check(status == 200 and "spec_verify_ct" not in g["meta_info"], f"no draft: /generate {g}")
        status, info = plain.request("GET", "/get_server_info")
        check(status == 200 and info.get("speculative_algorithm", "absent") is None
              and info["speculative_num_draft_tokens"] == 0, f"no draft: server info {info}")
    finally:
        plain.stop()
    greedy_want = run_tokens(PROMPT, 12, *flags)
    for draft in ("target:2", "target:1", "ngram:2"):
        s = Server(*flags, "--speculative-num-draft-tokens", "3", "--speculative-draft", draft)
        try:
            check(f"speculative: 3 draft tokens from {draft}," in s.banner, f"banner: {s.banner}")
            status, info = s.request("GET", "/get_server_info")
            check(status == 200 and info["speculative_num_draft_tokens"] == 3
                  and info["speculative_algorithm"] == ("NGRAM" if draft.startswith("ngram") else "STANDALONE"),
                  f"{draft}: server info {info}")
            status, r = s.post("/v1/completions", body)
            c = r["choices"][0] if status == 200 else {}
            check(status == 200 and len(c.get("token_ids", [])) == 14
                  and len(c["logprobs"]["token_logprobs"]) == 14, f"{draft}: sampled: {status} {r}")
            if draft == "target:2":
                check(c.get("token_ids") == want, f"{draft}: {c.get('token_ids')} != plain server {want}")
            # SGLang's spec_verify_ct: the target steps after the prefill's token, each emitting its
            # kept drafts and one more (1 to 4 tokens; 4 with an exact draft).
            status, g = s.post("/generate", gen)
            steps = g["meta_info"].get("spec_verify_ct") if status == 200 else None
            check(status == 200 and len(g["output_ids"]) == 14
                  and (g["output_ids"] == want and steps == 4 if draft == "target:2"
                       else steps is not None and 4 <= steps <= 13),
                  f"{draft}: /generate spec_verify_ct {steps}: {g}")
            status, r = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                                   "ignore_eos": True})
            check(status == 200 and r["choices"][0]["token_ids"] == greedy_want,
                  f"{draft}: greedy {r} != dcp run {greedy_want}")
            if draft.startswith("ngram"):  # a prompt holding every id: each token was seen before
                status, r = s.post("/v1/completions", {"prompt": list(range(512)), "max_tokens": 4,
                                                       "temperature": 0, "ignore_eos": True})
                check(status == 200, f"{draft}: {r}")
            m = s.metrics()
            drafts, proposed = m.get("dcp_spec_decode_drafts_total"), m.get("dcp_spec_decode_draft_tokens_total")
            accepted = m.get("dcp_spec_decode_accepted_tokens_total")
            # Every step after the first token verifies drafts, but lookup's finds none at times.
            extra = m["dcp_generation_tokens_total"] - (3 + drafts + accepted)
            check(drafts and proposed >= drafts and 0 <= accepted <= proposed
                  and 0 <= extra and (extra <= 3 or draft.startswith("ngram")),
                  f"{draft}: speculative metrics {drafts} {proposed} {accepted} of {m['dcp_generation_tokens_total']}")
            if draft == "target:2":
                check(accepted == proposed, f"{draft}: every draft kept: {accepted} of {proposed}")
        finally:
            code, _ = s.stop()
            check(code == 0, f"server exit {code}")


def case_max_model_len():
    """--max-model-len: a request's prompt and new tokens together at most; past it a 400 naming
    max_tokens, or the prompt's own field where the prompt alone reaches it; without max_tokens the
    reply stops there; /v1/models and /tokenize report it."""
    s = Server("--max-model-len", "64", "--tp-size", "2", "--dcp-size", "2")
    try:
        check("context 64" in s.banner, f"the banner says the context: {s.banner}")
        status, r = s.request("GET", "/v1/models")
        check(status == 200 and r["data"][0]["max_model_len"] == 64, f"/v1/models: {r}")
        status, r = s.post("/tokenize", {"prompt": "hi"})
        check(status == 200 and r["max_model_len"] == 64, f"/tokenize: {r}")
        prompt = [(k * 37) % 400 + 3 for k in range(60)]
        base = {"prompt": prompt, "temperature": 0, "ignore_eos": True}
        status, r = s.post("/v1/completions", {**base, "max_tokens": 4})
        check(status == 200 and r["usage"]["completion_tokens"] == 4, f"60 + 4 fits: {status} {r}")
        status, r = s.post("/v1/completions", {**base, "max_tokens": 5})
        check(status == 400 and r["error"]["param"] == "max_tokens" and "max_model_len" in r["error"]["message"],
              f"60 + 5 does not: {status} {r}")
        status, r = s.post("/v1/completions", base)
        check(status == 200 and r["usage"]["completion_tokens"] == 4 and r["choices"][0]["finish_reason"] == "length",
              f"without max_tokens, up to the context: {status} {r}")
        # The field the client bounded its tokens by is the one named.
        for path, body, param in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                             "max_completion_tokens": 64}, "max_completion_tokens"),
                                  ("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 5}},
                                   "max_new_tokens")]:
            status, r = s.post(path, body)
            check(status == 400 and r["error"]["param"] == param, f"{path}: past the context names {param}: {r}")
        long = [(k * 37) % 400 + 3 for k in range(64)]
        for path, body, param in [("/v1/completions", {"prompt": long}, "prompt"),
                                  ("/generate", {"input_ids": long}, "input_ids"),
                                  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 80}]},
                                   "messages")]:
            status, r = s.post(path, body)
            check(status == 400 and r["error"]["param"] == param and "model's context is 64" in r["error"]["message"],
                  f"{path}: a prompt that reaches the context: {status} {r}")
    finally:
        code, _ = s.stop()
        check(code == 0, f"server exit {code}")


def case_api_key():
    """--api-key (and $DCP_API_KEY): 401 without the bearer key on every endpoint but the health
    probe and the metrics."""
    for flags, env in [(("--api-key", "sesame"), {}), ((), {"DCP_API_KEY": "sesame"})]:
        os.environ.update(env)
        try:
            s = Server(*flags)
        finally:
            for k in env:
                del os.environ[k]
        try:
            body = {"prompt": [1, 2], "max_tokens": 2, "ignore_eos": True}  # sampled: EOS may come
            for headers in [{}, {"Authorization": "Bearer sesam"}, {"Authorization": "Bearer sesame2"},
                            {"Authorization": "sesame"}]:
                status, r = s.request("POST", "/v1/completions", body, headers=headers)
                check(status == 401 and "API key" in r["error"]["message"], f"{headers}: {status} {r}")
            for method, path in [("POST", "/generate"), ("POST", "/tokenize"), ("GET", "/v1/models")]:
                status, r = s.request(method, path, {"input_ids": [1]} if method == "POST" else None)
                check(status == 401, f"{method} {path} without the key: {status} {r}")
            status, r = s.request("POST", "/v1/completions", body, headers={"Authorization": "Bearer sesame"})
            check(status == 200 and len(r["choices"][0]["token_ids"]) == 2, f"with the key: {status} {r}")
            status, _ = s.request("GET", "/health")
            check(status == 200, f"/health needs no key: {status}")
            status, text = s.request("GET", "/metrics")
            check(status == 200 and "dcp_num_running_reqs" in text, f"/metrics needs no key: {status}")
        finally:
            code, _ = s.stop()
            check(code == 0, f"server exit {code}")


def case_queue_bound():
    """A full KV queues requests; past --max-queued-requests the server answers 503 and keeps serving.

    The first request holds nearly the whole KV for about eight thousand tokens: long enough to still
    run while the test sees it running, queues the second and sends the third, on a fast CPU too
    (with 256 tokens a Zen 5 core finished it before the third arrived)."""
    s = Server("--max-total-tokens", "8192", "--max-queued-requests", "1", "--page-size", "8")
    try:
        results = {}

        def long_one(key, n):
            results[key] = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": n, "temperature": 0,
                                                      "ignore_eos": True})
        first = threading.Thread(target=long_one, args=("first", 8192 - len(PROMPT) - 8))
        first.start()
        deadline = time.time() + 10
        while time.time() < deadline and s.metrics().get("dcp_num_running_reqs") != 1:
            time.sleep(0.01)
        second = threading.Thread(target=long_one, args=("second", 30))
        second.start()
        while time.time() < deadline and s.metrics().get("dcp_num_queued_reqs") != 1:
            time.sleep(0.01)
        status, r = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 5})
        check(status == 503 and "retry later" in r["error"]["message"], f"past the queue bound: {status} {r}")
        first.join()
        second.join()
        check(results["first"][0] == 200 and results["second"][0] == 200, "the running and the queued request finish")
        check(results["second"][1]["usage"]["completion_tokens"] == 30, "the queued request ran in full")
        # More choices than the queue holds, on an idle server: a 400 naming the field, not a
        # "retry later" that every retry gets again.
        for body, param in [({"prompt": PROMPT, "max_tokens": 2, "n": 2}, "n"),
                            ({"prompt": [PROMPT, PROMPT], "max_tokens": 2}, "prompt")]:
            status, r = s.post("/v1/completions", body)
            check(status == 400 and r["error"]["param"] == param and "--max-queued-requests" in r["error"]["message"],
                  f"{param}: more choices than the queue bound: {status} {r}")
        for body, param in [({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "n": 2}}, "n"),
                            ({"input_ids": [PROMPT, PROMPT], "sampling_params": {"max_new_tokens": 2}}, "input_ids")]:
            status, r = s.post("/generate", body)
            check(status == 400 and r["error"]["param"] == param and "--max-queued-requests" in r["error"]["message"],
                  f"/generate {param}: more samples than the queue bound: {status} {r}")
        status, r = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
        check(status == 200, f"a request within the bound after those: {status} {r}")
    finally:
        s.stop()


def case_shutdown():
    """SIGTERM: new requests get 503, the one in flight finishes, the process exits 0."""
    s = Server()
    results = {}

    def long_one():
        results["r"] = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 200, "temperature": 0,
                                                  "ignore_eos": True})
    t = threading.Thread(target=long_one)
    t.start()
    deadline = time.time() + 10
    while time.time() < deadline and s.metrics().get("dcp_num_running_reqs") != 1:
        time.sleep(0.01)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        status, _ = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        check(status == 503, f"after SIGTERM a new request gets 503, not {status}")
    except OSError:
        pass  # already closed: also refused
    t.join()
    code, out = s.stop()
    check(results["r"][0] == 200 and results["r"][1]["usage"]["completion_tokens"] == 200,
          "the request in flight finished")
    check(code == 0 and "stopped" in out, f"exit {code}: {out!r}")


def case_mpi(mpiexec, disaggregate=False):
    """Under mpirun, one rank per process (DP attention: two attention groups of TP 2 x DCP 2
    in a TP 4 group; disaggregated, a prefill rank ahead of them, the KV moving between
    processes): rank 0 serves, the others follow; greedy tokens equal dcp run's, with two requests
    at once (the second goes to the other group, which has more free KV)."""
    flags = ("--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--dcp-size", "2")
    if disaggregate:
        s = Server("--comm", "mpi", "--disaggregate", *flags, launcher=(mpiexec, "-np", "5"))
    else:
        s = Server("--comm", "mpi", *flags, launcher=(mpiexec, "-np", "4"))
    try:
        want = run_tokens(PROMPT, 12, *flags)
        got = {}

        def client(i):
            got[i] = s.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0,
                                                "ignore_eos": True})
        threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(2):
            status, r = got[i]
            check(status == 200 and r["choices"][0]["token_ids"] == want, f"mpi greedy {r} != {want}")
        _, _, events = s.stream("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 8, "temperature": 0, "stream": True})
        check(events[-1] == "[DONE]", "mpi stream ends")
        # Every rank masks a guided request by its own copy of the tokenizer's bytes.
        status, r = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0,
                                               "guided_regex": r"\d{3}-[a-z]{2,4}"})
        check(status == 200 and re.fullmatch(r"\d{3}-[a-z]{2,4}", r["choices"][0]["text"]), f"mpi regex: {r}")
        status, r = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0,
                                               "response_format": {"type": "json_object"}})
        c = r["choices"][0] if status == 200 else {}
        check(status == 200 and (c["finish_reason"] == "length" or isinstance(json.loads(c["text"]), dict)),
              f"mpi json_object: {r}")
        print("mpi: greedy", "disaggregated" if disaggregate else "with DP attention",
              "a chat stream, a regex and JSON mode checked", flush=True)
    finally:
        # mpirun exits 1 when it is signalled itself, even if every rank exits 0: signal rank 0,
        # which shuts the job down, as an operator would.
        rank0 = None
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if b"OMPI_COMM_WORLD_RANK=0" in env and DCP.encode() in cmd and b"serve" in cmd:
                rank0 = int(pid)
        check(rank0 is not None, "found rank 0's process")
        if rank0:
            os.kill(rank0, signal.SIGTERM)
        try:
            out, _ = s.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            out, _ = s.proc.communicate()
        check(s.proc.returncode == 0 and "stopped" in out, f"mpirun exit {s.proc.returncode}: {out!r}")


CASES = {f.__name__[5:]: f for f in [case_greedy_equals_run, case_stream_equals_whole, case_seeds,
                                     case_prompt_batch, case_stop_strings, case_penalties, case_masks, case_guided_regex, case_guided_grammar, case_json_mode, case_json_schema, case_structured_outputs, case_tokenize, case_chat_options, case_min_tokens, case_echo, case_prompt_logprobs, case_generate_logprobs, case_generate_batch, case_server_info, case_logprobs, case_errors, case_disconnect, case_concurrent_streams,
                                     case_idle_connections, case_pipelined_requests, case_kept_alive_requests,
                                     case_malformed_requests, case_bodyless_posts,
                                     case_metrics_and_models]}

OWN_SERVER = {f.__name__[5:]: f for f in [case_chat_template, case_tools, case_reasoning, case_prefix_cache, case_checkpoint_eos,
                                          case_generation_config, case_minicpm3, case_disaggregate,
                                          case_speculative_sampling,
                                          case_abort_request,
                                          case_max_model_len, case_api_key, case_queue_bound, case_shutdown]}


def main():
    # The servers inherit a soft open-file limit below the hard one, as a login shell's often is,
    # so that idle_connections sees the server lift it.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > 1024:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    subprocess.run([DCP, "gen-checkpoint", "--out", CKPT, "--num-layers", "2"], check=True, stdout=subprocess.DEVNULL)
    args = sys.argv[2:]
    if args[:1] in (["mpi"], ["mpi_disaggregate"]):
        case_mpi(args[1], disaggregate=args[0] == "mpi_disaggregate")
    else:
        wanted = args or list(CASES) + list(OWN_SERVER)
        shared = [n for n in wanted if n in CASES]
        if shared:
            s = Server("--tp-size", "2", "--dcp-size", "2", "--max-total-tokens", "4096")
            try:
                for name in shared:
                    print("case", name, flush=True)
                    CASES[name](s)
            finally:
                code, _ = s.stop()
                check(code == 0, f"server exit {code}")
        for name, case in OWN_SERVER.items():  # cases that start servers of their own
            if name in wanted:
                print("case", name, flush=True)
                case()
    subprocess.run(["rm", "-rf", TMP])
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


main()
