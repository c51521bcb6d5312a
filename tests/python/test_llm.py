"""LLM.generate against `dcp run` (the same greedy tokens for the same prompts and configuration),
text in and out through the checkpoint's tokenizer (against `dcp tokenize`), LLM.chat (its prompt
against `dcp tokenize --chat`), sampling seeds, stop tokens and strings, logprobs, timing and
errors."""
import json
import math
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import dcp

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 8], list(range(20, 90))]


def run_tokens(dcp_bin, model_flags, prompts, max_new, *flags):
    """What `dcp run` generates (greedy) for these prompts."""
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        subprocess.run(
            [dcp_bin, "run", *model_flags, "--prompt-tokens",
             ";".join(",".join(map(str, p)) for p in prompts), "--max-new-tokens", str(max_new),
             "--no-verify", "--json", report.name, *flags],
            check=True, stdout=subprocess.DEVNULL)
        return [r["output_tokens"] for r in json.load(report)["requests"]]


@pytest.mark.parametrize("config,flags", [
    (dict(tp_size=2, dcp_size=2), ["--tp-size", "2", "--dcp-size", "2"]),
    (dict(tp_size=2, dcp_size=2, dp_size=2), ["--tp-size", "2", "--dcp-size", "2", "--dp-size", "2"]),
    (dict(tp_size=2, dcp_size=2, dcp_comm_backend="ag_rs", kv_cache_dtype="fp32", page_size=16),
     ["--tp-size", "2", "--dcp-size", "2", "--dcp-comm-backend", "ag_rs", "--kv-cache-dtype", "fp32",
      "--page-size", "16"]),
    (dict(tp_size=4, dp_size=2, enable_dp_attention=True, dcp_size=2),
     ["--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--dcp-size", "2"]),
    (dict(tp_size=2, dcp_size=2, page_size=16, dcp_kv_cache_interleave_size=4),
     ["--tp-size", "2", "--dcp-size", "2", "--page-size", "16", "--dcp-kv-cache-interleave-size",
      "4"]),
    (dict(tp_size=2, dcp_size=2, threads_per_rank=3), ["--tp-size", "2", "--dcp-size", "2"]),
    # Disaggregated: a prefill rank, then the decode side (one group; two attention groups).
    (dict(tp_size=2, dcp_size=2, disaggregate=True), ["--tp-size", "2", "--dcp-size", "2"]),
    (dict(tp_size=4, dp_size=2, enable_dp_attention=True, dcp_size=2, disaggregate=True,
          prefill_dcp_size=2),
     ["--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--dcp-size", "2"]),
])
def test_greedy_tokens_equal_dcp_run_on_a_preset(dcp_bin, config, flags):
    with dcp.LLM("tiny", **config) as llm:
        got = llm.generate(PROMPTS, dcp.SamplingParams(max_tokens=12, temperature=0))
    want = run_tokens(dcp_bin, ["--preset", "tiny"], PROMPTS, 12, *flags)
    assert [o.outputs[0].token_ids for o in got] == want
    assert all(o.outputs[0].finish_reason == "length" for o in got)
    assert [o.prompt_token_ids for o in got] == PROMPTS


@pytest.mark.parametrize("ep_size", [1, 2])
def test_greedy_tokens_equal_dcp_run_on_an_moe_checkpoint(dcp_bin, tmp_path, ep_size):
    ckpt = str(tmp_path / "v2lite")
    subprocess.run([dcp_bin, "gen-checkpoint", "--family", "deepseek-v2-lite", "--out", ckpt],
                   check=True, stdout=subprocess.DEVNULL)
    with dcp.LLM(ckpt, tp_size=2, dcp_size=2, ep_size=ep_size) as llm:
        got = llm.generate(PROMPTS[:2], dcp.SamplingParams(max_tokens=6, temperature=0,
                                                           ignore_eos=True))
    want = run_tokens(dcp_bin, ["--model-path", ckpt], PROMPTS[:2], 6, "--tp-size", "2",
                      "--dcp-size", "2", "--ep-size", str(ep_size))
    assert [o.outputs[0].token_ids for o in got] == want


def test_minicpm3_checkpoint_takes_and_gives_text(dcp_bin, tmp_path):
    """MiniCPM3 (dense MLA, LongRoPE, muP scaling) with its SentencePiece-style vocabulary: the
    greedy tokens of a text prompt are `dcp run`'s for its ids, and the reply's text continues the
    prompt's decoded text (the first piece's space kept, as vLLM's detokenizer writes it)."""
    ckpt = str(tmp_path / "minicpm3")
    subprocess.run([dcp_bin, "gen-checkpoint", "--family", "minicpm3", "--out", ckpt],
                   check=True, stdout=subprocess.DEVNULL)
    with dcp.LLM(ckpt, tp_size=2, dcp_size=2) as llm:
        out = llm.generate("the cat sat in the hat",
                           dcp.SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
        prompt_ids, reply = out.prompt_token_ids, out.outputs[0]
        assert prompt_ids[0] == 1  # BOS, as the tokenizer's post-processor adds it
        assert llm.decode(prompt_ids + reply.token_ids, False) == \
            llm.decode(prompt_ids, False) + reply.text
    want = run_tokens(dcp_bin, ["--model-path", ckpt], [prompt_ids], 8, "--tp-size", "2",
                      "--dcp-size", "2")
    assert reply.token_ids == want[0]


def test_a_checkpoint_with_only_a_sentencepiece_model_takes_text(dcp_bin, tmp_path):
    """A checkpoint that ships SentencePiece's tokenizer.model and no tokenizer.json (as a slow
    Llama-style tokenizer comes) takes and gives text through it: the prompt's ids are
    SentencePiece's own, BOS first, and the reply's text is its ids decoded."""
    spm = pytest.importorskip("sentencepiece")
    ckpt = tmp_path / "minicpm3"
    subprocess.run([dcp_bin, "gen-checkpoint", "--family", "minicpm3", "--num-layers", "1",
                    "--out", str(ckpt)], check=True, stdout=subprocess.DEVNULL)
    (ckpt / "tokenizer.json").unlink()
    corpus = tmp_path / "corpus.txt"
    words = ["the", "cat", "sat", "on", "mat", "with", "a", "hat", "number", "and", "dog",
             "ran", "far", "away", "from", "home", "over", "hill", "under", "bridge"]
    corpus.write_text("\n".join(" ".join(words[(i * 7 + k * 3) % len(words)] + str(k % 10)
                                          for k in range(12)) for i in range(400)))
    # As many pieces as the model has ids: every id the model can sample has text.
    vocab = json.load(open(ckpt / "config.json"))["vocab_size"]
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(ckpt / "tokenizer"),
                                   model_type="bpe", vocab_size=vocab, byte_fallback=True,
                                   normalization_rule_name="identity",
                                   remove_extra_whitespaces=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(ckpt / "tokenizer.model"))
    with dcp.LLM(str(ckpt), tp_size=2, dcp_size=2) as llm:
        out = llm.generate("the cat sat on a hat",
                           dcp.SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
        assert out.prompt_token_ids == sp.encode("the cat sat on a hat", add_bos=True)
        reply = out.outputs[0]
        assert len(reply.token_ids) == 6
        assert llm.decode(out.prompt_token_ids + reply.token_ids, False) == \
            llm.decode(out.prompt_token_ids, False) + reply.text


def tokenizer_ids(checkpoint):
    """The ids the checkpoint's tokenizer has (the model's vocabulary is larger; the other ids
    have no text)."""
    t = json.load(open(f"{checkpoint}/tokenizer.json"))
    return set(t["model"]["vocab"].values()) | {a["id"] for a in t.get("added_tokens", [])}


@pytest.fixture(scope="module")
def text_llm(checkpoint):
    with dcp.LLM(checkpoint, tp_size=2, dcp_size=2, max_total_tokens=4096) as llm:
        yield llm


def test_text_in_and_out(dcp_bin, checkpoint, text_llm):
    prompt = "The quick brown fox jumps over the lazy dog"
    out = text_llm.generate(prompt, dcp.SamplingParams(max_tokens=8, temperature=0,
                                                       ignore_eos=True))[0]
    encoded = subprocess.run([dcp_bin, "tokenize", "--tokenizer-path", checkpoint,
                              "--add-special-tokens"], input=prompt, check=True,
                             capture_output=True, text=True)
    assert out.prompt == prompt
    assert out.prompt_token_ids == json.loads(encoded.stdout)
    ids = [t for t in out.outputs[0].token_ids if t in tokenizer_ids(checkpoint)]
    decoded = subprocess.run([dcp_bin, "tokenize", "--tokenizer-path", checkpoint, "--decode",
                              "--skip-special-tokens"], input=json.dumps(ids),
                             check=True, capture_output=True, text=True)
    assert out.outputs[0].text == decoded.stdout.rstrip("\n")
    want = run_tokens(dcp_bin, ["--model-path", checkpoint], [out.prompt_token_ids], 8,
                      "--tp-size", "2", "--dcp-size", "2")
    assert out.outputs[0].token_ids == want[0]


def test_seeded_sampling_repeats_and_seeds_differ(text_llm):
    prompts = [[5, 6, 7]] * 3
    params = [dcp.SamplingParams(max_tokens=16, temperature=1.0, seed=s, ignore_eos=True)
              for s in (1, 1, 2)]
    a, b, c = (o.outputs[0].token_ids for o in text_llm.generate(prompts, params))
    assert a == b
    assert a != c


def test_stop_token_ends_the_request(text_llm):
    greedy = text_llm.generate([[3, 1, 4, 1, 5]], dcp.SamplingParams(max_tokens=10, temperature=0,
                                                                     ignore_eos=True))[0]
    tokens = greedy.outputs[0].token_ids
    stop = tokens[3]
    out = text_llm.generate([[3, 1, 4, 1, 5]], dcp.SamplingParams(
        max_tokens=10, temperature=0, ignore_eos=True, stop_token_ids=[stop]))[0].outputs[0]
    assert out.token_ids == tokens[:tokens.index(stop) + 1]
    assert out.finish_reason == "stop"


def test_n_completions_are_the_seeds_one_after_another(text_llm):
    prompt = [5, 6, 7, 8]
    sampled = dict(max_tokens=6, temperature=1.0, top_k=50, ignore_eos=True)
    out = text_llm.generate(prompt, dcp.SamplingParams(n=3, seed=40, **sampled))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for j, c in enumerate(out.outputs):
        alone = text_llm.generate(prompt, dcp.SamplingParams(seed=40 + j, **sampled))[0].outputs[0]
        assert (c.token_ids, c.text) == (alone.token_ids, alone.text)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # the seeds differ
    greedy = text_llm.generate([prompt, [9]], dcp.SamplingParams(n=2, max_tokens=4, temperature=0))
    assert [len(r.outputs) for r in greedy] == [2, 2]
    assert greedy[0].outputs[0].token_ids == greedy[0].outputs[1].token_ids


def test_logit_bias_and_penalties_change_the_greedy_choice(text_llm):
    # Outcomes known without the model: a bias of 100 makes its token the greedy choice at every
    # step; a huge repetition penalty forbids it once emitted (it is not in the prompt).
    base = dict(max_tokens=4, temperature=0, ignore_eos=True)
    prompt = [1, 2, 3]

    def tokens(**kw):
        return text_llm.generate([prompt], dcp.SamplingParams(**base, **kw))[0].outputs[0].token_ids
    assert tokens(logit_bias={7: 100}) == [7] * 4
    repeated = tokens(logit_bias={7: 100.0}, repetition_penalty=1e6)
    assert repeated[0] == 7 and 7 not in repeated[1:]
    assert tokens(logit_bias={7: 100}, presence_penalty=2, frequency_penalty=2) == [7] * 4
    first = tokens()[0]
    assert first not in tokens(logit_bias={first: -100})


def test_allowed_token_ids_bad_words_and_truncation(checkpoint, text_llm):
    base = dict(max_tokens=6, temperature=0, ignore_eos=True)
    out = text_llm.generate([[6, 7, 8, 9]], dcp.SamplingParams(**base, allowed_token_ids=[5, 9, 400]))
    assert len(out[0].outputs[0].token_ids) == 6 and set(out[0].outputs[0].token_ids) <= {5, 9, 400}
    # A word the greedy text holds, banned: the token that made it never comes again.
    plain = text_llm.generate("Once upon a time", dcp.SamplingParams(**base))[0].outputs[0].token_ids
    named = tokenizer_ids(checkpoint)
    words = [(text_llm.decode([t]).strip(), t) for t in plain if t in named]
    words = [(w, t) for w, t in words if w and w.isascii() and w.isprintable()]
    assert words, f"no generated token with a printable word to ban: {plain}"
    word, banned = words[0]
    got = text_llm.generate("Once upon a time", dcp.SamplingParams(**base, bad_words=[word]))
    assert banned not in got[0].outputs[0].token_ids and got[0].outputs[0].token_ids != plain
    # truncate_prompt_tokens: the last 3 tokens are the prompt.
    cut = text_llm.generate([[1, 2, 3, 4, 5]], dcp.SamplingParams(**base, truncate_prompt_tokens=3))[0]
    alone = text_llm.generate([[3, 4, 5]], dcp.SamplingParams(**base))[0]
    assert cut.prompt_token_ids == [3, 4, 5] and cut.outputs[0].token_ids == alone.outputs[0].token_ids
    assert cut.prompt is None
    ids = text_llm.encode("Once upon a time")
    cut = text_llm.generate("Once upon a time", dcp.SamplingParams(**base, truncate_prompt_tokens=2))[0]
    assert cut.prompt_token_ids == ids[-2:] and cut.prompt == text_llm.decode(ids[-2:], False)


def test_guided_decoding(text_llm):
    """GuidedDecodingParams: a regex (Python's re decides), a choice, a JSON object (json decides);
    each sampled too; refusals."""
    import re
    G = dcp.GuidedDecodingParams
    base = dict(max_tokens=32, temperature=0)
    pattern = r"\d{3}-[a-z]{2,4}"
    out = text_llm.generate("Once upon a time", dcp.SamplingParams(**base, guided_decoding=G(regex=pattern)))
    assert re.fullmatch(pattern, out[0].outputs[0].text) and out[0].outputs[0].finish_reason == "stop"
    sampled = text_llm.generate("Once upon a time", dcp.SamplingParams(
        **{**base, "temperature": 1.0}, n=4, seed=2, guided_decoding=G(regex=pattern)))[0].outputs
    assert all(re.fullmatch(pattern, o.text) for o in sampled)
    colors = ["red", "green", "dark blue"]
    out = text_llm.generate("Name a color:", dcp.SamplingParams(**base, guided_decoding=G(choice=colors)))
    assert out[0].outputs[0].text in colors
    out = text_llm.generate("JSON:", dcp.SamplingParams(max_tokens=48, temperature=0,
                                                        guided_decoding=G(json_object=True)))
    o = out[0].outputs[0]
    assert (o.finish_reason == "length" and o.text.startswith("{")) or isinstance(json.loads(o.text), dict)
    schema = {"type": "object", "properties": {"b": {"type": "boolean"}, "a": {"enum": ["x", "y"]}},
              "required": ["b", "a"]}
    out = text_llm.generate("JSON:", dcp.SamplingParams(max_tokens=32, temperature=0,
                                                        guided_decoding=G(json=schema)))
    v = json.loads(out[0].outputs[0].text)
    assert list(v) == ["b", "a"] and isinstance(v["b"], bool) and v["a"] in ("x", "y")
    grammar = 'root ::= answer " " [1-9] [0-9]{0,2}\nanswer ::= "yes" | "no"'
    by_grammar = text_llm.generate("Once upon a time", dcp.SamplingParams(**base, guided_decoding=G(grammar=grammar)))
    assert re.fullmatch(r"(yes|no) [1-9][0-9]{0,2}", by_grammar[0].outputs[0].text)
    for bad, what in [(G(json={"type": "object", "minProperties": 2}), "'minProperties' above 1"),
                      (G(grammar="root ::= x"), "rule 'x' is used but not defined"),
                      (G(grammar=""), "must be a non-empty str"), (G(grammar="a", regex="a"), "set one of"),
                      (G(regex="a", choice=["a"]), "set one of"), (G(regex=""), "regex"),
                      (G(choice=[]), "choice"), (G(regex="(a"), "missing ')'")]:
        with pytest.raises(ValueError, match=re.escape(what)):
            text_llm.generate("hi", dcp.SamplingParams(max_tokens=4, guided_decoding=bad))
    # vLLM's newer names: SamplingParams.structured_outputs, StructuredOutputsParams.
    S = dcp.StructuredOutputsParams
    again = text_llm.generate("JSON:", dcp.SamplingParams(max_tokens=32, temperature=0,
                                                          structured_outputs=S(json=schema)))
    assert again[0].outputs[0].text == out[0].outputs[0].text
    again = text_llm.generate("Once upon a time", dcp.SamplingParams(**base, structured_outputs=S(grammar=grammar)))
    assert re.fullmatch(r"(yes|no) [1-9][0-9]{0,2}", again[0].outputs[0].text)
    with pytest.raises(ValueError, match="double quotes"):
        text_llm.generate("hi", dcp.SamplingParams(max_tokens=4, structured_outputs=S(grammar="root ::= 'a'")))
    with pytest.raises(ValueError, match="not both"):
        text_llm.generate("hi", dcp.SamplingParams(max_tokens=4, structured_outputs=S(regex="a"),
                                                   guided_decoding=G(regex="a")))


def test_min_tokens_and_include_stop_str_in_output(text_llm):
    # A token biased to be chosen at every step is also the stop token: it ends the request at
    # once, or at step min_tokens + 1.
    held = dict(max_tokens=10, temperature=0, ignore_eos=True, logit_bias={9: 100}, stop_token_ids=[9])
    out = text_llm.generate([[1, 2, 3]] * 2, [dcp.SamplingParams(**held),
                                              dcp.SamplingParams(**held, min_tokens=3)])
    assert out[0].outputs[0].token_ids == [9]
    ids = out[1].outputs[0].token_ids
    assert len(ids) == 4 and ids[-1] == 9 and 9 not in ids[:3]
    assert out[1].outputs[0].finish_reason == "stop"
    # A stop string within the first min_tokens tokens' text does not count.
    plain = dict(max_tokens=6, temperature=0, ignore_eos=True)
    text = text_llm.generate([[1, 2, 3]], dcp.SamplingParams(**plain))[0].outputs[0].text
    assert text
    kept = text_llm.generate([[1, 2, 3]], dcp.SamplingParams(**plain, stop=text[:1], min_tokens=6))
    assert kept[0].outputs[0].text == text
    # include_stop_str_in_output: the text ends after the stop string instead of before it.
    stop = text[-2:]
    cut, end = text.index(stop), text.index(stop) + len(stop)
    out = text_llm.generate([[1, 2, 3]] * 2, [dcp.SamplingParams(**plain, stop=stop),
                                              dcp.SamplingParams(**plain, stop=stop, include_stop_str_in_output=True)])
    assert [o.outputs[0].text for o in out] == [text[:cut], text[:end]]


def test_prompt_logprobs_of_a_greedy_continuation_equal_decodings(text_llm):
    # A prompt that is the model's own greedy continuation: each of those tokens has the logprob
    # decoding gave it, and is the most likely token there.
    first = text_llm.generate([[1, 2, 3]], dcp.SamplingParams(max_tokens=5, temperature=0, logprobs=0,
                                                             ignore_eos=True))[0].outputs[0]
    prompt = [1, 2, 3] + first.token_ids
    out = text_llm.generate([prompt], dcp.SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2,
                                                        n=2, seed=1))[0]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for p, (token, step) in enumerate(zip(first.token_ids, first.logprobs)):
        scored = out.prompt_logprobs[3 + p]
        assert token in scored and len(scored) <= 3
        assert abs(scored[token].logprob - step[token].logprob) < 0.05
        assert scored[token].logprob == max(e.logprob for e in scored.values())
        assert scored[token].rank == 1 and step[token].rank == 1
    assert text_llm.generate([prompt], dcp.SamplingParams(max_tokens=1))[0].prompt_logprobs is None


@pytest.mark.parametrize("params,message", [
    (dcp.SamplingParams(prompt_logprobs=21), "prompt_logprobs = 21 must be in [0, 20]"),
    (dcp.SamplingParams(min_tokens=5, max_tokens=3), "min_tokens = 5 must be in [0, max_tokens = 3]"),
    (dcp.SamplingParams(min_tokens=-1), "min_tokens = -1"),
    (dcp.SamplingParams(presence_penalty=2.5), "presence_penalty = 2.5 must be in [-2, 2]"),
    (dcp.SamplingParams(frequency_penalty=-3), "frequency_penalty = -3 must be in [-2, 2]"),
    (dcp.SamplingParams(repetition_penalty=0), "repetition_penalty = 0 must be > 0"),
    (dcp.SamplingParams(logit_bias={10**6: 1}), "logit_bias: token 1000000 is outside the vocabulary"),
    (dcp.SamplingParams(logit_bias={3: 200}), "logit_bias: token 3's bias 200 must be in [-100, 100]"),
    (dcp.SamplingParams(logit_bias={"x": 1}), "must map token ids to numbers"),
    (dcp.SamplingParams(logit_bias=[3]), "must map token ids to numbers"),
    (dcp.SamplingParams(allowed_token_ids=[]), "allowed_token_ids = [] must not be empty"),
    (dcp.SamplingParams(allowed_token_ids=[10**6]), "allowed_token_ids: token 1000000 is outside"),
    (dcp.SamplingParams(allowed_token_ids=["x"]), "must be token ids"),
    (dcp.SamplingParams(allowed_token_ids=[9], stop_token_ids=[9], min_tokens=1), "could mask every token"),
    (dcp.SamplingParams(bad_words=[" "]), "bad_words[0] = ' ' holds no token"),
    (dcp.SamplingParams(bad_words=[3]), "each bad word must be a str"),
    (dcp.SamplingParams(truncate_prompt_tokens=0), "truncate_prompt_tokens = 0 must be an int >= 1 or -1"),
])
def test_bad_penalties_raise(text_llm, params, message):
    with pytest.raises(ValueError) as e:
        text_llm.generate([[1, 2]], params)
    assert message in str(e.value)


def test_numpy_integers_are_token_ids(text_llm):
    params = dcp.SamplingParams(max_tokens=2, temperature=np.float32(0))
    want = text_llm.generate([[1, 2, 3]], params)[0].outputs[0].token_ids
    for prompt in [np.array([1, 2, 3]), [np.int64(1), np.int32(2), np.uint8(3)]]:
        assert text_llm.generate([prompt], params)[0].outputs[0].token_ids == want


@pytest.mark.parametrize("n", [0, 1.5, True])
def test_bad_n_raises(text_llm, n):
    with pytest.raises(ValueError, match="must be an int >= 1"):
        text_llm.generate([[1, 2]], dcp.SamplingParams(n=n))


def test_a_stop_string_ends_the_text_before_it(checkpoint, text_llm):
    prompt = "Once upon a time"
    params = dict(max_tokens=24, temperature=0, ignore_eos=True, logprobs=1)
    whole = text_llm.generate(prompt, dcp.SamplingParams(**params))[0].outputs[0]
    # A stop string from the second half of the greedy text (U+FFFD left out: the random model
    # emits bytes that are not whole characters), cut at its first occurrence.
    stop = next(whole.text[k:k + 2] for k in range(len(whole.text) // 2, len(whole.text) - 1)
                if "\ufffd" not in whole.text[k:k + 2])
    cut = whole.text.find(stop)
    assert stop and cut > 0
    out = text_llm.generate(prompt, dcp.SamplingParams(**params, stop=["never there", stop]))[0]
    got = out.outputs[0]
    assert got.text == whole.text[:cut]
    assert got.finish_reason == "stop"
    # The tokens up to the one that completed the stop string, their logprobs with them.
    n = len(got.token_ids)
    assert got.token_ids == whole.token_ids[:n] and len(got.logprobs) == n
    def text(ids):
        return text_llm.decode([t for t in ids if t in tokenizer_ids(checkpoint)])
    assert stop in text(got.token_ids) and stop not in text(got.token_ids[:-1])
    # A string that never comes changes nothing.
    same = text_llm.generate(prompt, dcp.SamplingParams(**params, stop="never there"))[0].outputs[0]
    assert (same.text, same.token_ids, same.finish_reason) == (whole.text, whole.token_ids, "length")


@pytest.mark.parametrize("stop,message", [("", "a stop string must not be empty"),
                                          (["a", 3], "each stop string must be a str")])
def test_bad_stop_strings_raise(text_llm, stop, message):
    with pytest.raises(ValueError, match=message):
        text_llm.generate("Hi", dcp.SamplingParams(stop=stop))


def test_logprobs_and_timing(text_llm, checkpoint):
    known = tokenizer_ids(checkpoint)
    out = text_llm.generate([[10, 11, 12]], dcp.SamplingParams(max_tokens=4, temperature=0,
                                                               logprobs=3, ignore_eos=True))[0]
    c = out.outputs[0]
    assert len(c.logprobs) == 4
    for token, step in zip(c.token_ids, c.logprobs):
        assert token in step and len(step) >= 3
        lps = [e.logprob for e in step.values()]
        assert step[token].logprob == max(lps) and step[token].rank == 1  # greedy: the most likely
        assert all(lp <= 0 for lp in lps)
        assert sum(math.exp(lp) for lp in lps) <= 1 + 1e-5
        # vLLM's Logprob: the alternatives ranked 1 to 3 by logprob, each with its text alone.
        ranked = sorted(step.values(), key=lambda e: e.rank)
        assert [e.rank for e in ranked] == [1, 2, 3]
        assert all(a.logprob >= b.logprob for a, b in zip(ranked, ranked[1:]))
        for t, e in step.items():
            assert isinstance(e, dcp.Logprob)
            if t in known:
                assert e.decoded_token == text_llm.decode([t], skip_special_tokens=False)
            else:
                assert e.decoded_token is None
    assert 0 < out.time_to_first_token_s <= out.latency_s


@pytest.mark.parametrize("prompts,params,message", [
    ([[1, 2]], dcp.SamplingParams(max_tokens=0), "max_tokens"),
    ([[1, 2]], dcp.SamplingParams(temperature=-1), "temperature"),
    ([[1, 2]], dcp.SamplingParams(top_p=0), "top_p"),
    ([[]], dcp.SamplingParams(), "prompts[0] is empty"),
    ([[1, 10**6]], dcp.SamplingParams(), "vocab"),
    ([[1 + t % 500 for t in range(5000)]], dcp.SamplingParams(), "the KV cache holds 4096"),
    ([[1], [2]], [dcp.SamplingParams()], "sampling_params has 1 entries for 2 prompts"),
    # Numbers of the wrong kind are refused, not truncated or parsed.
    ([[1, 2.0]], dcp.SamplingParams(), "prompts[0][1] = 2.0 must be an integer"),
    ([{"prompt_token_ids": ["7"]}], dcp.SamplingParams(), "prompts[0][0] = '7' must be an integer"),
    ([[True]], dcp.SamplingParams(), "prompts[0][0] = True must be an integer"),
    ([[1, 2]], dcp.SamplingParams(max_tokens=2.5), "max_tokens = 2.5 must be an integer"),
    ([[1, 2]], dcp.SamplingParams(temperature="0"), "temperature = '0' must be a number"),
    ([[1, 2]], dcp.SamplingParams(stop_token_ids=[3.0]), "stop_token_ids[0] = 3.0 must be an integer"),
    ([[1, 2]], dcp.SamplingParams(seed=1.5), "seed = 1.5 must be an integer"),
])
def test_bad_requests_raise_and_leave_the_llm_usable(text_llm, prompts, params, message):
    with pytest.raises(ValueError) as e:
        text_llm.generate(prompts, params)
    assert message in str(e.value)
    ok = text_llm.generate([[1, 2, 3]], dcp.SamplingParams(max_tokens=2, temperature=0))
    assert len(ok[0].outputs[0].token_ids) == 2


def test_max_model_len_bounds_prompt_and_new_tokens():
    with dcp.LLM("tiny", max_model_len=64) as llm:
        prompt = [1 + t % 500 for t in range(60)]
        out = llm.generate([prompt], dcp.SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 4
        with pytest.raises(ValueError) as e:
            llm.generate([prompt], dcp.SamplingParams(max_tokens=5))
        assert "max_model_len" in str(e.value)
        # truncate_prompt_tokens -1 keeps the context's worth, 64 tokens, which leave no room.
        with pytest.raises(ValueError) as e:
            llm.generate([prompt * 2], dcp.SamplingParams(max_tokens=1, truncate_prompt_tokens=-1))
        assert "the prompt holds 64 tokens; the model's context is 64" in str(e.value)
        cut = llm.generate([prompt * 2], dcp.SamplingParams(max_tokens=1, truncate_prompt_tokens=63))
        assert cut[0].prompt_token_ids == (prompt * 2)[-63:]


def test_prefix_cache_computes_a_prompt_once_for_its_completions():
    prompt = [1 + (7 * t) % 500 for t in range(100)]
    sampled = dcp.SamplingParams(n=3, seed=7, max_tokens=5, temperature=1.0, ignore_eos=True)
    with dcp.LLM("tiny", page_size=8, tp_size=2, dcp_size=2) as plain:
        want = [c.token_ids for c in plain.generate([prompt], sampled)[0].outputs]
        assert plain.generate([prompt], sampled)[0].num_cached_tokens == 0
    with dcp.LLM("tiny", page_size=8, tp_size=2, dcp_size=2, enable_prefix_cache=True,
                 host_kv_capacity_tokens=1024) as llm:
        first = llm.generate([prompt], sampled)[0]
        # The first completion computed the prompt (nothing cached yet); the same prompt again
        # finds its whole widened pages (8 x DCP 2) but the last token's.
        again = llm.generate([prompt], sampled)[0]
        assert (first.num_cached_tokens, again.num_cached_tokens) == (0, 99 // 16 * 16)
        # After a reset the prompt is computed again, then found again.
        llm.reset_prefix_cache()
        cold = llm.generate([prompt], sampled)[0]
        warm = llm.generate([prompt], sampled)[0]
        assert (cold.num_cached_tokens, warm.num_cached_tokens) == (0, 99 // 16 * 16)
        for out in (first, again, cold, warm):
            assert [c.token_ids for c in out.outputs] == want
    with dcp.LLM("tiny") as plain, pytest.raises(ValueError, match="enable_prefix_cache"):
        plain.reset_prefix_cache()


def test_speculative_decoding_keeps_greedy_tokens_and_samples_as_without_it():
    prompts = [[1 + (5 * t) % 500 for t in range(n)] for n in (3, 40)]
    greedy = dcp.SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    sampled = dcp.SamplingParams(n=2, seed=11, max_tokens=12, temperature=0.9, top_p=0.95, ignore_eos=True)

    def tokens(llm, params):
        return [[c.token_ids for c in out.outputs] for out in llm.generate(prompts, params)]
    with dcp.LLM("tiny", tp_size=2, dcp_size=2) as plain:
        want_greedy, want_sampled = tokens(plain, greedy), tokens(plain, sampled)
    # The whole target as its draft: every draft is kept, so sampled tokens are plain sampling's.
    with dcp.LLM("tiny", tp_size=2, dcp_size=2, speculative_num_draft_tokens=3,
                 speculative_draft="target:2") as llm:
        assert tokens(llm, greedy) == want_greedy
        assert tokens(llm, sampled) == want_sampled
    # Its first layer: greedy tokens are the target's; sampled ones run to their length.
    with dcp.LLM("tiny", tp_size=2, dcp_size=2, speculative_num_draft_tokens=2,
                 speculative_draft="target:1") as llm:
        assert tokens(llm, greedy) == want_greedy
        assert all(len(c) == 12 for out in tokens(llm, sampled) for c in out)
    # N-gram lookup, no draft model: the same.
    with dcp.LLM("tiny", tp_size=2, dcp_size=2, speculative_num_draft_tokens=3,
                 speculative_draft="ngram:2") as llm:
        assert tokens(llm, greedy) == want_greedy
        assert all(len(c) == 12 for out in tokens(llm, sampled) for c in out)


def test_a_refused_request_drops_the_whole_batch(text_llm):
    # The first request is valid, the second too long: nothing of the batch runs.
    with pytest.raises(ValueError):
        text_llm.generate([[1, 2, 3], [1 + t % 500 for t in range(5000)]], dcp.SamplingParams(max_tokens=2))
    ok = text_llm.generate([[1, 2, 3]], dcp.SamplingParams(max_tokens=2, temperature=0))
    assert len(ok) == 1 and ok[0].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("kwargs,message", [
    (dict(model="no-such-model"), "neither a checkpoint folder nor a preset"),
    (dict(model="x" * 300), "neither a checkpoint folder nor a preset"),  # too long for a file name
    (dict(model="tiny", tp_size=4, dcp_size=3), "legal dcp_size values"),
    (dict(model="tiny", kv_cache_dtype="fp8"), "fp32"),
    (dict(model="tiny", max_total_tokens=0), "max_total_tokens = 0 must be >= 1"),
    (dict(model="tiny", tp_size=2.0), "tp_size = 2.0 must be an integer"),
    (dict(model="tiny", tp_size=2, ep_size=2), "ep_size = 2 must divide the model's routed experts (0;"),
    (dict(model="tiny", page_size=16, dcp_kv_cache_interleave_size=3),
     "dcp_kv_cache_interleave_size = 3 must divide page_size = 16"),
    (dict(model="tiny", threads_per_rank=0), "threads_per_rank = 0 must be in [1, 256]"),
    (dict(model="tiny", host_kv_capacity_tokens=64), "host_kv_capacity_tokens = 64 needs enable_prefix_cache=True"),
    (dict(model="tiny", enable_prefix_cache=True, host_kv_capacity_tokens=-1),
     "host_kv_capacity_tokens = -1 must be >= 0"),
    (dict(model="tiny", max_model_len=200000), "max_model_len = 200000 must be in [1, max_position_embeddings = 163840]"),
    (dict(model="tiny", prefill_dcp_size=2), "prefill_dcp_size needs disaggregate=True"),
    (dict(model="tiny", disaggregate=True, prefill_dcp_size=0), "prefill_dcp_size = 0 must be >= 1"),
    (dict(model="tiny", tp_size=2, dcp_size=2, disaggregate=True, prefill_dcp_size=3),
     "prefill DCP size 3 -> decode DCP size 2 is not supported"),
    (dict(model="tiny", speculative_num_draft_tokens=2), "speculative_num_draft_tokens needs speculative_draft"),
    (dict(model="tiny", speculative_draft="target:1"), "speculative_draft needs speculative_num_draft_tokens >= 1"),
    (dict(model="tiny", speculative_num_draft_tokens=-1, speculative_draft="target:1"),
     "speculative_num_draft_tokens = -1 must be >= 0"),
    (dict(model="tiny", speculative_num_draft_tokens=2, speculative_draft="target:3"),
     "speculative_draft 'target:3': target:N needs 1 <= N <= 2"),
    (dict(model="tiny", speculative_num_draft_tokens=2, speculative_draft="deepseek-v3"),
     "speculative_draft 'deepseek-v3' has a vocabulary of 129280, the target 512"),
    (dict(model="tiny", speculative_num_draft_tokens=2, speculative_draft="nosuch"),
     "speculative_draft 'nosuch' is neither ngram:N, target:N, a checkpoint folder nor a preset"),
    (dict(model="tiny", speculative_num_draft_tokens=2, speculative_draft="ngram:0"),
     "speculative_draft 'ngram:0': ngram:N needs 1 <= N <= 1024"),
    (dict(model="tiny", weight_kernel="bogus"), "weight_kernel = 'bogus': kernel path 'bogus'"),
    (dict(model="tiny", weight_kernel="amx_bf16"), "weight_kernel = amx_bf16: kernel path amx_bf16 is an attention path"),
    # tiny's weights are fp32: nothing to pair (or, without AVX512-BF16, the path is unavailable)
    (dict(model="tiny", weight_kernel="avx512_bf16"), "weight_kernel = avx512_bf16"),
])
def test_bad_configurations_raise(kwargs, message):
    with pytest.raises((ValueError, NotImplementedError)) as e:
        dcp.LLM(**kwargs)
    assert message in str(e.value)


def test_chat_renders_the_template_then_generates(dcp_bin, checkpoint, text_llm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    params = dcp.SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    out = text_llm.chat(messages, params)[0]

    def tokenize(*flags):
        return subprocess.run([dcp_bin, "tokenize", "--tokenizer-path", checkpoint, "--chat",
                               "--add-generation-prompt", *flags], input=json.dumps(messages),
                              check=True, capture_output=True, text=True).stdout
    assert out.prompt == tokenize("--print-prompt")
    assert out.prompt_token_ids == json.loads(tokenize())
    alone = text_llm.generate({"prompt_token_ids": out.prompt_token_ids}, params)[0]
    assert out.outputs[0].token_ids == alone.outputs[0].token_ids
    # Several conversations, a template for the call, no generation prompt.
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}" \
               "{% if add_generation_prompt %}<assistant>{% endif %}"
    outs = text_llm.chat([messages, [{"role": "user", "content": "Yo"}]], [params, params],
                         chat_template=template, add_generation_prompt=False)
    assert [o.prompt for o in outs] == ["<system>Be brief.<user>Hi", "<user>Yo"]
    assert outs[1].prompt_token_ids == text_llm.encode("<user>Yo", add_special_tokens=False)
    # Template variables (overriding add_generation_prompt), and an open final message.
    outs = text_llm.chat(messages, params, chat_template=template + "{{ tail }}",
                         chat_template_kwargs={"tail": "!", "add_generation_prompt": True})
    assert outs[0].prompt == "<system>Be brief.<user>Hi<assistant>!"
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello the"}]
    open_end = text_llm.chat(turns, params, add_generation_prompt=False, continue_final_message=True)[0]
    assert open_end.prompt == "<s><|user|>Hi<|assistant|>Hello the"
    closed = text_llm.chat(turns, params, add_generation_prompt=False)[0]
    assert closed.prompt == open_end.prompt + "</s>"
    # Tools reach the template as its `tools` variable.
    tools = [{"type": "function", "function": {"name": "get_weather"}},
             {"type": "function", "function": {"name": "now"}}]
    out = text_llm.chat(messages, params, tools=tools,
                        chat_template="{% for t in tools %}{{ t.function.name }};{% endfor %}")[0]
    assert out.prompt == "get_weather;now;"


def test_the_checkpoints_eos_token_ids_end_a_request(checkpoint, text_llm, tmp_path):
    # Kimi's turns end with a token that is not the tokenizer's eos_token; the checkpoint's
    # generation_config.json names it, and it ends a request as the tokenizer's EOS does.
    prompt = [5, 17, 9, 33]
    ids = text_llm.generate([prompt], dcp.SamplingParams(max_tokens=8, temperature=0,
                                                         ignore_eos=True))[0].outputs[0].token_ids
    eos, tokenizer_eos = ids[3], text_llm.encode("</s>")[0]
    k = min(j for j, t in enumerate(ids) if t in (eos, tokenizer_eos))
    own = tmp_path / "model"
    shutil.copytree(checkpoint, own)
    (own / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    with dcp.LLM(str(own), tp_size=2, dcp_size=2, max_total_tokens=4096) as llm:
        out = llm.generate([prompt], dcp.SamplingParams(max_tokens=8, temperature=0))[0].outputs[0]
        assert out.token_ids == ids[:k + 1] and out.finish_reason == "stop"
        out = llm.generate([prompt], dcp.SamplingParams(max_tokens=8, temperature=0,
                                                        ignore_eos=True))[0].outputs[0]
        assert out.token_ids == ids and out.finish_reason == "length"


def test_generation_config_gives_the_default_sampling(checkpoint, text_llm, tmp_path):
    # vLLM's generation_config="auto": without sampling_params, the checkpoint's recommended
    # sampling (top_k 1 here: the greedy tokens whatever the temperature).
    prompt = [5, 17, 9, 33]
    greedy = text_llm.generate([prompt], dcp.SamplingParams(temperature=0))[0].outputs[0].token_ids
    own = tmp_path / "model"
    shutil.copytree(checkpoint, own)
    (own / "generation_config.json").write_text(json.dumps({"top_k": 1, "temperature": 0.7}))
    with dcp.LLM(str(own), max_total_tokens=4096) as llm:
        d = llm.get_default_sampling_params()
        assert (d.top_k, d.temperature, d.top_p) == (1, 0.7, 1.0)
        assert llm.generate([prompt])[0].outputs[0].token_ids == greedy
    with dcp.LLM(str(own), max_total_tokens=4096, generation_config="vllm") as llm:
        d = llm.get_default_sampling_params()
        assert (d.top_k, d.temperature) == (dcp.SamplingParams().top_k, 1.0)
    with pytest.raises(ValueError, match="generation_config = 'model' must be 'auto'"):
        dcp.LLM(str(own), generation_config="model")


def test_chat_content_parts_take_the_form_the_template_reads(text_llm):
    # As dcp serve (and vLLM) hand them: text parts joined by a newline for a template that writes
    # content as a string, passed as parts to one that loops over them.
    params = dcp.SamplingParams(max_tokens=1)
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                          {"type": "text", "text": "there"}]}]
    assert text_llm.chat(parts, params)[0].prompt == "<s><|user|>Hi\nthere<|assistant|>"
    loop = "{% for m in messages %}{% for p in m['content'] %}({{ p.text }}){% endfor %}{% endfor %}"
    assert text_llm.chat(parts, params, chat_template=loop)[0].prompt == "(Hi)(there)"
    # continue_final_message continues the last part, as transformers does.
    turns = parts + [{"role": "assistant", "content": [{"type": "text", "text": "Hello"},
                                                       {"type": "text", "text": "the"}]}]
    out = text_llm.chat(turns, params, add_generation_prompt=False, continue_final_message=True)
    assert out[0].prompt == "<s><|user|>Hi\nthere<|assistant|>Hello\nthe"


@pytest.mark.parametrize("messages,kwargs,message", [
    ([{"role": "user", "content": "Hi"}], dict(continue_final_message=True),
     "continue_final_message needs add_generation_prompt=False"),
    ([{"role": "user", "content": "Hi"}], dict(continue_final_message=True, add_generation_prompt=False,
                                               chat_template="{{ 'x' }}"), "did not write the final message"),
    ([{"role": "user", "content": "Hi"}], dict(chat_template_kwargs={"messages": []}),
     "chat_template_kwargs = {'messages': []} must be a dict"),
    ([{"role": "user", "content": "Hi"}], dict(chat_template_kwargs=[1]), "must be a dict"),
    ([{"role": "user", "content": "Hi"}], dict(chat_template="{% if x %}"), "line 1"),
    ([{"role": "user", "content": "Hi"}], dict(tools={"name": "f"}), "tools must be a list of tool dicts"),
    ([{"role": "user", "content": "Hi"}], dict(tools=[{"f": {1}}]), "is not JSON"),
    (["not a conversation"], {}, "messages[0] must be a list of message dicts"),
    ([{"role": "user", "content": {1, 2}}], {}, "messages are not JSON"),
    ([], {}, "messages is empty"),
    ([[{"role": "user", "content": "a"}], []], {}, "conversation 1: the conversation has no messages"),
    ([{"content": "Hi"}], {}, "messages[0] must be an object with a string 'role'"),
    ([{"role": "user", "content": 5}], {}, "messages[0].content must be a string, null or a list"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], {},
     "messages[0].content[0] is a part of type 'image_url': this engine reads text only"),
    ([[{"role": "user", "content": "a"}], [{"role": "user", "content": [{"text": "b"}]}]], {},
     "conversation 1: messages[0].content[0] must be {\"type\": \"text\""),
    ([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
     dict(sampling_params=[dcp.SamplingParams()]), "sampling_params has 1 entries for 2 conversations"),
])
def test_bad_chats_raise_and_leave_the_llm_usable(text_llm, messages, kwargs, message):
    with pytest.raises(ValueError) as e:
        text_llm.chat(messages, **kwargs)
    assert message in str(e.value)
    ok = text_llm.chat([{"role": "user", "content": "Hi"}], dcp.SamplingParams(max_tokens=2))
    assert len(ok[0].outputs[0].token_ids) <= 2


def test_text_needs_a_tokenizer():
    with dcp.LLM("tiny") as llm:
        with pytest.raises(ValueError, match="no tokenizer"):
            llm.generate("hello")
        with pytest.raises(ValueError, match="chat needs a tokenizer"):
            llm.chat([{"role": "user", "content": "hello"}])
        with pytest.raises(ValueError, match="stop strings need a tokenizer"):
            llm.generate([[1, 2]], dcp.SamplingParams(stop="x"))
        with pytest.raises(ValueError, match="bad_words need a tokenizer"):
            llm.generate([[1, 2]], dcp.SamplingParams(bad_words=["x"]))


def test_closed_llm_refuses_work():
    llm = dcp.LLM("tiny")
    llm.close()
    with pytest.raises(ValueError, match="closed"):
        llm.generate([[1, 2]])
