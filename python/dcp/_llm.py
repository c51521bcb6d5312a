"""Offline generation in the shape of vLLM's ``LLM.generate`` and ``LLM.chat``.

    llm = dcp.LLM(model="deepseek-v2-lite", num_layers=2, tp_size=2, dcp_size=2)
    out = llm.generate([[1, 2, 3], [4, 5]], dcp.SamplingParams(max_tokens=8, temperature=0))
    out[0].outputs[0].token_ids

The ranks run as threads of this process for as long as the LLM lives (``close()``, or a
``with`` block, stops them); the weights load once.
"""
import dataclasses
import json
import random
from typing import Dict, List, Optional, Sequence, Union

from . import _dcp
from ._numbers import boolean as _boolean, integer as _integer, real as _real
from ._numbers import token_ids as _token_ids


@dataclasses.dataclass
class GuidedDecodingParams:
    """Guided decoding (vLLM's names); set one of: regex (the text matches it whole: dcp serve's
    guided_regex syntax), choice (the text is one of these strings, as each tokenizes), json (a
    JSON Schema, as a dict or its JSON text: the text is valid under it, properties in its order;
    dcp serve's json_schema subset), grammar (a GBNF grammar: the text is one it derives, from its
    rule root) or json_object=True (the text is one JSON object)."""
    json: Optional[object] = None
    regex: Optional[str] = None
    choice: Optional[Sequence[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None


# vLLM's newer name for the same constraints (SamplingParams.structured_outputs).
StructuredOutputsParams = GuidedDecodingParams


@dataclasses.dataclass
class SamplingParams:
    """How each request's tokens are chosen (vLLM's names and defaults).

    temperature 0 is greedy; top_k 0 or -1 is off; seed None draws a fresh seed per request.
    Generation stops after max_tokens, or at a token of stop_token_ids, or at the tokenizer's
    EOS token or the checkpoint's (generation_config.json's eos_token_id) unless ignore_eos, or
    where the text comes to contain a string of stop (the text
    ends before it, or after it with include_stop_str_in_output; the token that completed it is
    the last); none of these before min_tokens
    tokens (a stop string must end in a later token's text). logprobs k (0-20) returns each
    step's chosen token and the k most likely ones. n completions of each prompt are sampled,
    the i-th with seed + i when seeded (as dcp serve does). logit_bias {token id: bias in
    [-100, 100]} is added to the logits; then repetition_penalty (> 0) divides the positive logits
    of tokens of the prompt or the output so far and multiplies the others; then
    frequency_penalty and presence_penalty ([-2, 2]) are subtracted per occurrence and once from
    the logits of tokens the output holds (vLLM's meanings and order). allowed_token_ids keeps
    only those tokens; bad_words (strings: each as it tokenizes at the start of a text and after a
    space) are never generated: a word's last token is masked where its others end the output.
    truncate_prompt_tokens k keeps each prompt's last k tokens (-1: the context's worth: the lesser
    of max_total_tokens and max_model_len).
    guided_decoding (GuidedDecodingParams) constrains the text to a regex, a choice or a JSON
    object; it needs a tokenizer. structured_outputs (StructuredOutputsParams, vLLM's newer name)
    is the same, in its place.
    """
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Optional[Dict[int, float]] = None
    allowed_token_ids: Optional[Sequence[int]] = None
    bad_words: Optional[Sequence[str]] = None
    truncate_prompt_tokens: Optional[int] = None
    seed: Optional[int] = None
    stop: Union[str, Sequence[str], None] = None
    include_stop_str_in_output: bool = False
    stop_token_ids: Sequence[int] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    guided_decoding: Optional[GuidedDecodingParams] = None
    structured_outputs: Optional[StructuredOutputsParams] = None


@dataclasses.dataclass
class Logprob:
    """One token's logprob (vLLM's): its rank among the vocabulary's by logprob (1: the most
    likely; ties by token id) and its text alone (None without a tokenizer)."""
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: Optional[str]  # None without a tokenizer
    token_ids: List[int]
    finish_reason: str  # "length", "stop" (a stop token or EOS) or "cancelled"
    logprobs: Optional[list]  # per step {token_id: Logprob}, when asked for


@dataclasses.dataclass
class RequestOutput:
    request_id: int
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    # Seconds from submission to the first token (of any completion) and to the last, measured
    # by the frontend.
    time_to_first_token_s: float
    latency_s: float
    # With SamplingParams.prompt_logprobs: None for the first prompt token, then per token
    # {token_id: Logprob} (its own and the k most likely there).
    prompt_logprobs: Optional[list] = None
    # Prompt tokens whose KV the prefix cache held (LLM(enable_prefix_cache=True)), as the
    # first completion found them: with n > 1 the others reuse the pages it computes.
    num_cached_tokens: int = 0


def _guided(p: SamplingParams):
    """(regex, choice, json_object, grammar) for the request, or ValueError naming what is
    unsupported."""
    if p.guided_decoding is not None and p.structured_outputs is not None:
        raise ValueError("set one of guided_decoding and structured_outputs, not both")
    name = "guided_decoding" if p.structured_outputs is None else "structured_outputs"
    g = getattr(p, name)
    if g is None:
        return "", [], False, ""
    if not isinstance(g, GuidedDecodingParams):
        raise ValueError(f"{name} = {g!r} must be a GuidedDecodingParams (StructuredOutputsParams)")
    given = [field for field in ("regex", "choice", "json", "grammar", "json_object")
             if getattr(g, field) is not None and getattr(g, field) is not False]
    if len(given) > 1:
        raise ValueError(f"{name}: set one of regex, choice, json, grammar and json_object, not {given}")
    if g.json is not None:
        schema = g.json if isinstance(g.json, str) else json.dumps(g.json)
        return _dcp._json_schema_regex(schema), [], False, ""
    if g.grammar is not None:
        if not (isinstance(g.grammar, str) and g.grammar):
            raise ValueError(f"{name}.grammar = {g.grammar!r} must be a non-empty str (GBNF)")
        return "", [], False, g.grammar
    if g.regex is not None and not (isinstance(g.regex, str) and g.regex):
        raise ValueError(f"{name}.regex = {g.regex!r} must be a non-empty str")
    choice = [] if g.choice is None else list(g.choice)
    if g.choice is not None and (not choice or not all(isinstance(c, str) and c for c in choice)):
        raise ValueError(f"{name}.choice = {g.choice!r} must be non-empty strings")
    return g.regex or "", choice, bool(g.json_object), ""


class LLM:
    """A model served by ranks running as threads of this process.

    model: a checkpoint folder (config.json and safetensors or pytorch_model.bin; tokenizer.json,
    tiktoken.model or SentencePiece's tokenizer.model when it has one) or a preset name (synthetic weights, token ids only: see dcp --help).
    The rest are `dcp run`'s flags under their Python names.
    """

    def __init__(self, model: str = "tiny", *, tokenizer: Optional[str] = None,
                 num_layers: int = 0, tp_size: int = 1, dcp_size: int = 1, dp_size: int = 1,
                 enable_dp_attention: bool = False, ep_size: int = 1,
                 dcp_comm_backend: Optional[str] = None,
                 dcp_replicate_q_proj: bool = False, page_size: int = 64,
                 dcp_kv_cache_interleave_size: int = 1,
                 kv_cache_dtype: str = "bf16", attention_kernel: str = "automatic",
                 weight_kernel: str = "automatic", threads_per_rank: int = 1,
                 max_total_tokens: int = 65536, max_model_len: Optional[int] = None,
                 chunked_prefill_size: int = 2048,
                 max_running_requests: int = 64, enable_prefix_cache: bool = False,
                 host_kv_capacity_tokens: int = 0, comm_timeout_s: float = 300.0,
                 generation_config: str = "auto", disaggregate: bool = False,
                 prefill_dcp_size: Optional[int] = None, speculative_num_draft_tokens: int = 0,
                 speculative_draft: Optional[str] = None):
        if generation_config not in ("auto", "vllm"):
            raise ValueError(f"generation_config = {generation_config!r} must be 'auto' (the "
                             "checkpoint's generation_config.json sampling defaults) or 'vllm'")
        self._generation_config = generation_config
        c = _dcp._LlmConfig()
        c.model = str(model)
        c.tokenizer = "" if tokenizer is None else str(tokenizer)
        c.num_layers = _integer(num_layers, "num_layers")
        c.tp_size = _integer(tp_size, "tp_size")
        c.dcp_size = _integer(dcp_size, "dcp_size")
        c.dp_size = _integer(dp_size, "dp_size")
        c.enable_dp_attention = _boolean(enable_dp_attention, "enable_dp_attention")
        c.ep_size = _integer(ep_size, "ep_size")
        c.dcp_comm_backend = "" if dcp_comm_backend is None else str(dcp_comm_backend)
        c.dcp_replicate_q_proj = _boolean(dcp_replicate_q_proj, "dcp_replicate_q_proj")
        c.page_size = _integer(page_size, "page_size")
        c.dcp_kv_cache_interleave_size = _integer(dcp_kv_cache_interleave_size,
                                                  "dcp_kv_cache_interleave_size")
        c.kv_cache_dtype = str(kv_cache_dtype)
        c.attention_kernel = str(attention_kernel)
        c.weight_kernel = str(weight_kernel)
        c.threads_per_rank = _integer(threads_per_rank, "threads_per_rank")
        c.max_total_tokens = _integer(max_total_tokens, "max_total_tokens")
        c.max_model_len = 0 if max_model_len is None else _integer(max_model_len, "max_model_len")
        c.chunked_prefill_size = _integer(chunked_prefill_size, "chunked_prefill_size")
        c.max_running_requests = _integer(max_running_requests, "max_running_requests")
        c.enable_prefix_cache = _boolean(enable_prefix_cache, "enable_prefix_cache")
        c.host_kv_capacity_tokens = _integer(host_kv_capacity_tokens, "host_kv_capacity_tokens")
        c.comm_timeout_s = _real(comm_timeout_s, "comm_timeout_s")
        if _boolean(disaggregate, "disaggregate"):
            c.prefill_dcp_size = 1 if prefill_dcp_size is None else _integer(prefill_dcp_size,
                                                                             "prefill_dcp_size")
            if c.prefill_dcp_size < 1:
                raise ValueError(f"prefill_dcp_size = {c.prefill_dcp_size} must be >= 1")
        elif prefill_dcp_size is not None:
            raise ValueError("prefill_dcp_size needs disaggregate=True")
        c.speculative_num_draft_tokens = _integer(speculative_num_draft_tokens,
                                                  "speculative_num_draft_tokens")
        c.speculative_draft = "" if speculative_draft is None else str(speculative_draft)
        self._llm = _dcp._Llm(c)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Stops the ranks (requests still running are cancelled); the LLM is unusable after."""
        self._llm.close()

    def reset_prefix_cache(self):
        """Empties the prefix cache before the next request, as vLLM's does (a benchmark's cold
        start without reloading the weights); ValueError when the LLM has no prefix cache."""
        self._llm.reset_prefix_cache()

    @property
    def vocab_size(self) -> int:
        return self._llm.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        return list(self._llm.encode(text, add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._llm.decode(list(token_ids), skip_special_tokens)

    def generate(self, prompts, sampling_params: Union[SamplingParams, Sequence[SamplingParams],
                                                       None] = None) -> List[RequestOutput]:
        """Generates for every prompt and returns one RequestOutput each, in order.

        prompts: a string, a list of token ids, or a list of either; a dict
        {"prompt_token_ids": [...]} or {"prompt": "..."} as vLLM takes them. Text needs a
        tokenizer. sampling_params: one for all, or one per prompt.
        """
        if isinstance(prompts, (str, dict)) or (
                isinstance(prompts, (list, tuple)) and prompts and
                all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        params = self._params(sampling_params, len(prompts), "prompts")
        texts, ids = [], []
        for i, p in enumerate(prompts):
            text, tokens = self._prompt(i, p)
            texts.append(text)
            ids.append(tokens)
        return self._run(texts, ids, params)

    def chat(self, messages, sampling_params: Union[SamplingParams, Sequence[SamplingParams],
                                                    None] = None, *,
             chat_template: Optional[str] = None,
             add_generation_prompt: bool = True,
             continue_final_message: bool = False,
             chat_template_kwargs: Optional[Dict[str, object]] = None,
             tools: Optional[List[Dict[str, object]]] = None) -> List[RequestOutput]:
        """Generates the next turn of every conversation and returns one RequestOutput each.

        messages: a conversation (a list of {"role": ..., "content": ...} dicts) or a list of
        them. Each is rendered by the tokenizer's chat template (chat_template: Jinja source to
        use instead), whose text is the RequestOutput's prompt; the template writes the special
        tokens, so none are added. sampling_params: one for all, or one per conversation.
        chat_template_kwargs: more template variables (they override add_generation_prompt).
        continue_final_message (with add_generation_prompt=False): the prompt ends with the last
        message's content, which the reply continues, instead of a closed turn.
        tools: OpenAI-style tool definitions, the template's `tools` variable (vLLM's); the reply
        is text, in the model's own tool-call format where it calls one.
        """
        if not self._llm.has_tokenizer:
            raise ValueError("chat needs a tokenizer: a checkpoint with tokenizer.json, "
                             "tiktoken.model or tokenizer.model, or LLM(..., tokenizer=PATH)")
        variables = chat_template_kwargs or {}
        if not isinstance(variables, dict) or "messages" in variables:
            raise ValueError(f"chat_template_kwargs = {chat_template_kwargs!r} must be a dict of "
                             "template variables other than 'messages'")
        try:
            variables = json.loads(json.dumps(variables))
        except (TypeError, ValueError) as e:
            raise ValueError(f"chat_template_kwargs is not JSON: {e}") from None
        if tools is not None and "tools" not in variables:  # chat_template_kwargs override it
            if not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools):
                raise ValueError(f"tools must be a list of tool dicts, got {tools!r}")
            try:
                variables["tools"] = json.loads(json.dumps(list(tools)))
            except (TypeError, ValueError) as e:
                raise ValueError(f"tools is not JSON: {e}") from None
        generation_prompt = bool(variables.pop("add_generation_prompt", add_generation_prompt))
        if continue_final_message and generation_prompt:
            raise ValueError("continue_final_message needs add_generation_prompt=False (the reply "
                             "continues the final message instead of starting a turn)")
        messages = list(messages)
        if not messages:
            raise ValueError("messages is empty: give a conversation (a list of message dicts) "
                             "or a list of them")
        one = isinstance(messages[0], dict)
        conversations = [messages] if one else messages
        params = self._params(sampling_params, len(conversations), "conversations")
        texts, ids = [], []
        for i, conversation in enumerate(conversations):
            where = "" if one else f"conversation {i}: "
            if not isinstance(conversation, (list, tuple)):
                raise ValueError(f"messages[{i}] must be a list of message dicts, got "
                                 f"{type(conversation).__name__}")
            if not conversation:
                raise ValueError(f"{where}the conversation has no messages")
            try:
                listed = json.dumps(list(conversation))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}messages are not JSON: {e}") from None
            try:
                # Content parts in the form the template reads, as dcp serve (and vLLM) hand them.
                plain = json.loads(self._llm.openai_chat_messages(listed, chat_template))
            except ValueError as e:
                raise ValueError(f"{where}{e}") from None
            context = json.dumps({**variables, "messages": plain,
                                  "add_generation_prompt": generation_prompt})
            text = self._llm.apply_chat_template(context, generation_prompt, chat_template)
            if continue_final_message:
                content = plain[-1].get("content")
                if isinstance(content, list) and content:  # its last part, as transformers takes
                    content = content[-1]["text"]
                text = self._llm.continue_final_message(text, content if isinstance(content, str) else "")
            tokens = self.encode(text, add_special_tokens=False)
            if not tokens:
                raise ValueError(f"messages[{i}] renders to an empty prompt")
            texts.append(text)
            ids.append(tokens)
        return self._run(texts, ids, params)

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate and chat use without sampling_params (vLLM's): with
        generation_config="auto", the sampling fields the checkpoint's generation_config.json
        states (temperature, top_p, top_k, min_p, repetition_penalty), else SamplingParams()."""
        if self._generation_config == "vllm":
            return SamplingParams()
        return SamplingParams(**self._llm.sampling_defaults)

    def _params(self, sampling_params, count, what):
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        params = list(sampling_params)
        if len(params) != count:
            raise ValueError(f"sampling_params has {len(params)} entries for {count} {what}")
        return params

    def _run(self, texts, ids, params):
        counts = []
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
            if isinstance(p.n, bool) or not isinstance(p.n, int) or p.n < 1:
                raise ValueError(f"n = {p.n!r} must be an int >= 1")
            counts.append(p.n)
        texts, ids = list(texts), list(ids)
        for i, p in enumerate(params):
            keep = p.truncate_prompt_tokens
            if keep is None:
                continue
            if isinstance(keep, bool) or not isinstance(keep, int) or not (keep == -1 or keep >= 1):
                raise ValueError(f"truncate_prompt_tokens = {keep!r} must be an int >= 1 or -1 "
                                 "(the context)")
            keep = self._llm.context_tokens if keep == -1 else keep
            if len(ids[i]) > keep:  # the prompt becomes the tokens kept
                ids[i] = ids[i][-keep:]
                texts[i] = None if texts[i] is None else self.decode(ids[i], False)
        # One engine request per completion, all in one batch: a refusal drops them all.
        requests = [self._request(ids[i], params[i], j)
                    for i in range(len(ids)) for j in range(counts[i])]
        results = iter(self._llm.generate(requests))
        outputs = []
        for i in range(len(ids)):
            generated = [next(results) for _ in range(counts[i])]
            completions = [CompletionOutput(j, g.text, list(g.token_ids), g.finish_reason,
                                            self._logprobs(g.logprobs)
                                            if params[i].logprobs is not None else None)
                           for j, g in enumerate(generated)]
            prompt_lp = None
            if params[i].prompt_logprobs is not None:
                prompt_lp = [None] + self._logprobs(generated[0].prompt_logprobs)
            outputs.append(RequestOutput(i, texts[i], ids[i], completions,
                                         min(g.time_to_first_token_s for g in generated),
                                         max(g.latency_s for g in generated), prompt_lp,
                                         generated[0].cached_prompt_tokens))
        return outputs

    def _logprobs(self, steps):
        """vLLM's per step {token_id: Logprob} from the engine's (token, logprob, rank) lists."""
        ids = sorted({t for step in steps for t, _, _ in step})
        texts = dict(zip(ids, self._llm.token_texts(ids)))
        return [{t: Logprob(lp, rank, texts[t]) for t, lp, rank in step} for step in steps]

    def _prompt(self, i, p):
        if isinstance(p, dict):
            if "prompt_token_ids" in p:
                p = p["prompt_token_ids"]
            elif "prompt" in p:
                p = p["prompt"]
            else:
                raise ValueError(f"prompts[{i}] must have 'prompt' or 'prompt_token_ids'")
        if isinstance(p, str):
            if not self._llm.has_tokenizer:
                raise ValueError(f"prompts[{i}] is text but this model has no tokenizer: pass "
                                 "token ids, or LLM(..., tokenizer=PATH)")
            return p, self.encode(p, add_special_tokens=True)
        try:
            tokens = _token_ids(p, f"prompts[{i}]")
        except TypeError:
            raise ValueError(f"prompts[{i}] must be a string or a list of token ids, got "
                             f"{type(p).__name__}") from None
        if not tokens:
            raise ValueError(f"prompts[{i}] is empty: a prompt needs at least one token")
        return None, tokens

    def _request(self, tokens, p: SamplingParams, completion: int):
        stop = _token_ids(p.stop_token_ids, "stop_token_ids")
        if not _boolean(p.ignore_eos, "ignore_eos"):  # the tokenizer's and the checkpoint's
            stop += [i for i in self._llm.eos_token_ids if i not in stop]
        top_k = _integer(p.top_k, "top_k")
        top_k = 0 if top_k == -1 else top_k
        seed = None if p.seed is None else _integer(p.seed, "seed")
        if seed is not None and seed < 0:
            raise ValueError(f"seed = {p.seed} must be >= 0")
        seed = random.getrandbits(63) if seed is None else seed + completion
        logprobs = -1 if p.logprobs is None else _integer(p.logprobs, "logprobs")
        # One completion of each prompt computes them: its others share the prompt.
        prompt_logprobs = (-1 if p.prompt_logprobs is None or completion > 0
                           else _integer(p.prompt_logprobs, "prompt_logprobs"))
        stop_strings = [p.stop] if isinstance(p.stop, str) else list(p.stop or ())
        for s in stop_strings:  # an empty one is refused with the request (TextStream)
            if not isinstance(s, str):
                raise ValueError(f"stop = {p.stop!r}: each stop string must be a str")
        try:  # keys as ints, or as the decimal strings of OpenAI's JSON
            bias = {int(t) if isinstance(t, str) and t.isascii() and t.isdigit()
                    else _integer(t, "logit_bias key"): _real(b, "logit_bias value")
                    for t, b in (p.logit_bias or {}).items()}
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"logit_bias = {p.logit_bias!r} must map token ids to numbers") from None
        try:
            allowed = _token_ids(p.allowed_token_ids or (), "allowed_token_ids")
        except (TypeError, ValueError):
            raise ValueError(f"allowed_token_ids = {p.allowed_token_ids!r} must be token ids") from None
        if p.allowed_token_ids is not None and not allowed:
            raise ValueError("allowed_token_ids = [] must not be empty (None allows every token)")
        bad_words = [p.bad_words] if isinstance(p.bad_words, str) else list(p.bad_words or ())
        for w in bad_words:
            if not isinstance(w, str):
                raise ValueError(f"bad_words = {p.bad_words!r}: each bad word must be a str")
        regex, choice, json_object, grammar = _guided(p)
        return _dcp._GenerateRequest(tokens, _integer(p.max_tokens, "max_tokens"),
                                     _real(p.temperature, "temperature"), _real(p.top_p, "top_p"),
                                     top_k, _real(p.min_p, "min_p"),
                                     _real(p.presence_penalty, "presence_penalty"),
                                     _real(p.frequency_penalty, "frequency_penalty"),
                                     _real(p.repetition_penalty, "repetition_penalty"), bias,
                                     allowed, bad_words, seed, stop,
                                     _integer(p.min_tokens, "min_tokens"), stop_strings,
                                     _boolean(p.include_stop_str_in_output,
                                              "include_stop_str_in_output"),
                                     prompt_logprobs,
                                     _boolean(p.skip_special_tokens, "skip_special_tokens"),
                                     logprobs, regex, choice, json_object, grammar)
