"""dcp's chat templates against Python's Jinja2 (Debian's python3-jinja2) set up as transformers'
apply_chat_template sets it up: a sandbox, trim_blocks and lstrip_blocks, loop controls, `tojson`
as `json.dumps` without HTML escaping, `raise_exception`. Templates written here in the styles of
the published tool templates (Python signatures built by recursive macros and call blocks,
arguments written by `|items` or `|tojson`, arguments tested for their type first, arguments
concatenated) and templates over the rest of the Jinja chat templates use, each rendered on random
conversations by both: the text must be identical, or both must fail.

Then OpenAI's messages (a call's arguments as a JSON string) through `dcp serve`'s conversion:
a template that reads arguments only as a mapping gets them parsed, as vLLM parses them; any other
gets the client's string, so a template that tests the type writes the model's own text and one
that concatenates (DeepSeek's) renders at all (with vLLM's dicts Jinja2 itself fails on it)."""
import json
import random
from datetime import datetime

import pytest

import dcp

jinja2 = pytest.importorskip("jinja2", reason="Debian's python3-jinja2 is the reference")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=["jinja2.ext.loopcontrols"])
ENV.filters["tojson"] = _tojson
ENV.globals["raise_exception"] = _raise
ENV.globals["strftime_now"] = lambda format: datetime.now().strftime(format)


def reference(template, context):
    try:
        return ENV.from_string(template).render(**context)
    except Exception as e:  # noqa: BLE001: any failure is compared with dcp's
        return ("error", type(e).__name__, str(e))


def rendered(template, context):
    try:
        return dcp._dcp._render_chat_template(template, json.dumps(context))
    except ValueError as e:
        return ("error", str(e))


def same(got, want):
    if isinstance(want, tuple) or isinstance(got, tuple):
        return isinstance(want, tuple) and isinstance(got, tuple)
    return got == want


# Tools shown as Python signatures (MiniCPM3's way): nested objects become classes through
# recursion over call blocks; a past call is written `name(key=value, ...)` from its arguments
# as a mapping.
PYTHON_SIGNATURES = r"""
{%- macro py_type(name, spec) -%}
  {%- set simple = {'string': 'str', 'integer': 'int', 'number': 'float', 'boolean': 'bool'} -%}
  {%- if spec.enum -%}{{ name|capitalize }}
  {%- elif simple[spec.type] is defined -%}{{ simple[spec.type] }}
  {%- elif spec.type == 'array' -%}List[{{ py_type(name, spec['items']) }}]
  {%- elif spec.type == 'object' and spec.properties -%}{{ name|capitalize }}
  {%- elif spec.type is iterable and spec.type is not string -%}
    Union[{% for t in spec.type %}{{ py_type(name, {'type': t}) }}{{ ', ' if not loop.last }}{% endfor %}]
  {%- else -%}Any{%- endif -%}
{%- endmacro -%}
{%- macro fields(spec, indent) -%}
  {%- set acc = namespace(text=caller()) -%}
  {%- for key, field in spec.properties|items -%}
    {%- if field.type == 'object' and field.properties -%}
      {%- call fields(field, '    ') -%}{{ '\nclass ' ~ key|capitalize ~ ':\n' }}{%- endcall -%}
    {%- elif field.enum -%}
      {%- set acc.text = acc.text ~ '\nclass ' ~ key|capitalize ~ '(Enum): ' ~ field.enum|join(', ') ~ '\n' -%}
    {%- endif -%}
    {%- set optional = key not in spec.get('required', []) -%}
    {%- set acc.text = acc.text ~ indent ~ key ~ ': ' ~ ('Optional[' if optional) ~ py_type(key, field) ~ (']' if optional) -%}
    {%- if field.description %}{% set acc.text = acc.text ~ '  # ' ~ field.description %}{% endif -%}
    {%- set acc.text = acc.text ~ '\n' -%}
  {%- endfor -%}
  {{- acc.text -}}
{%- endmacro -%}
{%- if tools %}<|im_start|>system
{% for tool in tools %}{% set f = tool.function if tool.function is defined else tool %}
{%- call fields(f.parameters, '        ') %}def {{ f.name }}({{ f.parameters.properties|list|join(', ') }}):
    \"\"\"{{ f.description }}\"\"\"
{% endcall %}
{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}
<|im_start|>{{ message.role }}
{% if message.role == 'assistant' and message.tool_calls %}
<|tool_call_start|>
{% for tool_call in message.tool_calls %}
{% if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}
{{ tool_call.name }}({% for k, v in tool_call.arguments|items %}{{ k }}={{ v|tojson }}{{ ', ' if not loop.last }}{% endfor %})
{% endfor %}
<|tool_call_end|>
{% endif %}
{{ message.content if message.content is string else '' }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Arguments written with `tojson` and no test first (Qwen2.5's way).
TOJSON_ARGUMENTS = r"""
{%- if tools %}<tools>{% for t in tools %}
{{ t|tojson }}{% endfor %}
</tools>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls is defined and m.tool_calls %}
<|assistant|>{{ m.content or '' }}{% for tc in m.tool_calls %}{% set tc = tc.function %}
<tool_call>{"name": {{ tc.name|tojson }}, "arguments": {{ tc.arguments|tojson }}}</tool_call>
{%- endfor %}
{% else %}
<|{{ m.role }}|>{{ m.content }}
{% endif %}
{%- endfor %}"""

# Arguments tested for their type first (Kimi K2's and Qwen3's way).
TYPE_TESTED = r"""
{%- for m in messages -%}
[{{ m['role'] }}]{{ m['content'] if m['content'] is not none }}
{%- for tc in m.get('tool_calls', []) -%}
<call id={{ tc['id'] }}>{% if tc['function']['arguments'] is string %}{{ tc['function']['arguments'] }}{% else %}{{ tc['function']['arguments'] | tojson }}{% endif %}</call>
{%- endfor %}

{% endfor -%}"""

# Arguments concatenated (DeepSeek-V3's way).
CONCATENATED = r"""
{%- for message in messages -%}
{%- if message['role'] == 'assistant' and message['tool_calls'] -%}
{%- for tool in message['tool_calls'] -%}
{{ '<call>' + tool['type'] + '|' + tool['function']['name'] + '\n```json\n' + tool['function']['arguments'] + '\n```</call>' }}
{%- endfor -%}
{%- else -%}
{{ '<' + message['role'] + '>' + (message['content'] or '') }}
{%- endif -%}
{%- endfor -%}"""

# The rest of what chat templates use: loops and their variables, namespaces, macros with
# defaults and keywords, string and dict methods, slices, filters, tests, whitespace control.
GENERAL = [
    r"""{{ bos_token }}{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ m.role|upper }}
{%- if loop.first %} (first){% elif loop.last %} (last){% endif %}: {{ m.content|trim }}
{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}""",
    r"""{% set ns = namespace(system='', n=0) %}{% for m in messages %}{% if m.role == 'system' %}
{% set ns.system = ns.system + m.content %}{% else %}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}
{{ ns.system|length }}:{{ ns.n }}|{{ messages|length }}|{{ (messages|last).role }}|{{ (messages|first)['role'] }}""",
    r"""{% macro turn(m, prefix='>', sep=': ') %}{{ prefix }}{{ m.role|capitalize }}{{ sep }}{{ m.content }}{% endmacro %}
{% for m in messages[1:] %}{{ turn(m) }}
{{ turn(m, sep=' = ', prefix='#') }}
{% endfor %}{{ messages[::-1]|map(attribute='role')|join(',') }}""",
    r"""{% for m in messages %}{% if m.content is string %}{{ m.content|upper }}|{{ m.content|lower }}|{{ m.content|title }}|{{ m.content|capitalize }}|{{ m.content.title() }}|{{ m.content.upper().lower() }}
{{ m.content.split()|tojson }} {{ m.content.split(none, 1)|tojson }} {{ m.content.strip()|tojson }} {{ m.content.lstrip()|tojson }} {{ m.content.rstrip()|tojson }} {{ m.content|trim|tojson }} {{ m.content.strip('Σ.ü ')|tojson }}
{% endif %}{% endfor %}""",
    r"""{% for m in messages %}{% if m.content is string %}{{ m.content.split(' ')|length }} {{ m.content.startswith('a') }} {{ m.content.endswith('.') }} {{ m.content.replace(' ', '_')[:12] }} {{ m.content.lstrip().rstrip()|length }} {{ m.content.upper()[-3:] }}
{% endif %}{% endfor %}""",
    r"""{% for t in tools or [] %}{{ t.function.name }}({{ t.function.parameters.properties.keys()|list|join(', ') }}) {{ t.function.parameters|dictsort|length }} {{ t.function.parameters.get('required', [])|tojson }}
{% endfor %}{{ tools|tojson(indent=2) if tools }}""",
    r"""{%- for m in messages -%}
{%- if m.role not in ['user', 'assistant', 'system', 'tool'] %}{{ raise_exception('bad role ' + m.role) }}{% endif -%}
{%- if loop.index0 is even %}E{% else %}O{% endif -%}
{{ m.content|default('none')|string|length if m.content is defined }}{{ '-' if not loop.last }}
{%- endfor %} {{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|rejectattr('role', 'equalto', 'user')|map(attribute='role')|unique|list|join('+') }}""",
    r"""{% set summary %}{% for m in messages %}{{ m.role[:1]|upper }}{% endfor %}{% endset %}{{ summary }}|{{ summary|length }}
{{ messages|map(attribute='role')|sort|join(',') }} {{ messages|map(attribute='role')|sort(reverse=true)|unique|join(',') }} {{ messages|selectattr('content', 'string')|sort(attribute='role,content')|map(attribute='content')|first }}
{{ messages|map(attribute='role')|min }} {{ messages|map(attribute='role')|max(case_sensitive=true) }} {{ [messages|length, 2.5, -1]|sum }} {{ -(messages|length)|abs }} {{ (messages|length / 3)|round(2) }} {{ (messages|length / 7)|round(1, 'floor') }} {{ 2.675|round(2) }}
{% for m in messages %}{% if m.content is string %}{{ m.content|indent(3) }}|{{ m.content|indent('> ', first=true, blank=true) }}|{{ m.content.splitlines()|tojson }}|{{ m.content.rsplit(none, 1)|tojson }}|{{ m.content.rsplit(' ', 2)|tojson }}|{{ ' / '.join(m.content.split()) }}|{{ m.content.removeprefix('the').removesuffix('.') }}|{{ m.content.rfind('a') }}|{{ m.content|int(-1) }}|{{ m.content|float }}|{{ m.content|trim|int }}
{% endif %}{% endfor %}{{ strftime_now('%Y-%m-%d') }}""",
    r"""{% macro tag(name) %}<{{ name }}{% for v in varargs %} {{ v }}{% endfor %}{% for k, v in kwargs|dictsort %} {{ k }}={{ v }}{% endfor %}>{{ varargs }}{% endmacro %}
{% for m in messages %}{{ loop.cycle('odd', 'even') }}{{ loop.changed(m.role) }}{{ tag(m.role, loop.index, loop.depth) if loop.index is divisibleby 2 else tag(m.role, first=loop.first) }}
{% if m.role is in ['user', 'system'] and loop.index is gt 1 and loop.revindex is le 3 %}{{ m|dictsort|first }} {{ m.items()|list|last }} {{ (m.role, loop.index) }} {{ (m.role,) + (1,) }} {{ (m.role, 2) == [m.role, 2] }}{% endif %}
{% endfor %}{{ messages|map(attribute='role')|select('in', ['tool', 'system'])|list|length }} {{ range(10)|select('divisibleby', 3)|list }} {{ [(2, 'b'), (1, 'z'), (1, 'a')]|sort }}""",
    r"""{% for m in messages %}{% for k, v in m|items %}{% if k != 'tool_calls' %}{{ k }}={{ v|tojson }};{% endif %}{% endfor %}
{% if loop.index > 3 %}{% break %}{% endif %}{% endfor %}{{ range(3)|list }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 5 }} {{ 'x' * 3 }} {{ 1.5|int }} {{ '3'|int + 1 }} {{ 10 / 4 }} {{ [1, 2] + [3] }} {{ none }} {{ true and not false }}""",
]

WORDS = ["the", "weather", "Paris", "über", "naïve", "日本語", "🙂", "a", "\"quoted\"", "it's",
         "back\\slash", "tab\there", "new\nline", "<tag>", "&amp;", "", " ", "x.", "100",
         # what case and whitespace rules treat apart: full mappings, titlecase digraphs, final
         # sigma (with case-ignorable marks), dotted I, ligatures, Unicode spaces, separators
         "Straße", "ǅemal", "ΟΔΥΣΣΕΥΣ", "ΣΑΣ'", "Σ.", "ὈΔΥΣΣΕΎΣ", "İstanbul", "ﬁne", "ŉ",
         "unit_name", "x-ray(y)", "[a]{b}<c>", "\u00a0nbsp", "ideo\u3000space", "\u2028ls",
         "\x1cfs", "\u0085nel", "Ǳ", "ᾳ", "ÉCOLE", "mIxEd",
         # what |int and |float read: Python's number syntax
         "1_000", "-7", "3.5e2", "nan", "inf", "-1e3", "+2_5", ".5", "1_", "0x10", "\r\n"]


def text(rng, n=6):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, n)))


def value(rng, depth=0):
    kind = rng.choice(["str", "int", "float", "bool", "null", "list", "dict"] if depth < 2
                      else ["str", "int", "float", "bool", "null"])
    if kind == "str":
        return text(rng, 3)
    if kind == "int":
        return rng.choice([0, -1, 7, 2 ** 40, -123456789])
    if kind == "float":
        return rng.choice([0.5, -2.25, 1e-07, 3.0, 1.0e22, 123.456, rng.uniform(-1e3, 1e3)])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(WORDS[:9]) + str(i): value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def schema(rng, depth=0):
    props = {}
    for i in range(rng.randint(1, 4)):
        kind = rng.choice(["string", "integer", "number", "boolean", "array", "enum", "union"]
                          + (["object"] if depth < 1 else []))
        name = rng.choice(["city", "days", "unit", "query", "limit", "options"]) + str(i)
        if kind == "array":
            props[name] = {"type": "array", "items": {"type": rng.choice(["string", "integer"])}}
        elif kind == "enum":
            props[name] = {"type": "string", "enum": ["celsius", "fahrenheit"]}
        elif kind == "union":
            props[name] = {"type": ["string", "null"]}
        elif kind == "object":
            props[name] = schema(rng, depth + 1)
        else:
            props[name] = {"type": kind}
        if rng.random() < 0.5:
            props[name]["description"] = text(rng, 4)
    return {"type": "object", "properties": props,
            "required": [k for k in props if rng.random() < 0.5]}


def tool(rng, i):
    return {"type": "function", "function": {"name": f"tool_{i}", "description": text(rng, 5),
                                             "parameters": schema(rng)}}


def call(rng, i):
    arguments = {rng.choice(["city", "days", "q", "ü", "n"]) + str(k): value(rng)
                 for k in range(rng.randint(0, 3))}
    # As OpenAI clients send them: a JSON string, compact or not, ASCII-escaped or not.
    spelt = json.dumps(arguments, separators=rng.choice([(",", ":"), (", ", ": ")]),
                       ensure_ascii=rng.random() < 0.5)
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": f"tool_{rng.randint(0, 2)}", "arguments": spelt}}


def conversation(rng):
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": text(rng)})
    for turn in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": text(rng)})
        if rng.random() < 0.6:
            calls = [call(rng, 10 * turn + k) for k in range(rng.randint(1, 3))]
            messages.append({"role": "assistant", "content": rng.choice([None, "", text(rng)]),
                             "tool_calls": calls})
            for c in calls:
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": text(rng)})
        else:
            messages.append({"role": "assistant", "content": text(rng)})
    context = {"messages": messages, "bos_token": "<s>", "eos_token": "</s>",
               "add_generation_prompt": rng.random() < 0.5}
    if rng.random() < 0.7:
        context["tools"] = [tool(rng, i) for i in range(rng.randint(1, 3))]
    return context


def vllm_messages(messages):
    """vLLM's _postprocess_messages: each assistant call's arguments parsed (empty: {})."""
    out = json.loads(json.dumps(messages))
    for m in out:
        for c in m.get("tool_calls") or []:
            a = c["function"].get("arguments")
            c["function"]["arguments"] = json.loads(a) if a else {}
    return out


TOOL_TEMPLATES = [("python signatures", PYTHON_SIGNATURES, "mapping"),
                  ("tojson arguments", TOJSON_ARGUMENTS, "mapping"),
                  ("type tested", TYPE_TESTED, "string"),
                  ("concatenated", CONCATENATED, "string")]


@pytest.mark.parametrize("index", range(len(GENERAL) + len(TOOL_TEMPLATES)))
def test_templates_render_as_jinja2_renders_them(index):
    template = (GENERAL + [t for _, t, _ in TOOL_TEMPLATES])[index]
    rng = random.Random(100 + index)
    compared = 0
    for _ in range(150):
        context = conversation(rng)
        if index >= len(GENERAL) and TOOL_TEMPLATES[index - len(GENERAL)][2] == "mapping":
            context["messages"] = vllm_messages(context["messages"])
        want, got = reference(template, context), rendered(template, context)
        assert same(got, want), f"template {index} on {json.dumps(context)[:300]}: {got!r} != {want!r}"
        compared += not isinstance(want, tuple)
    assert compared >= 100, f"template {index}: only {compared} renders succeeded"


@pytest.mark.parametrize("name,template,form", TOOL_TEMPLATES, ids=[t[0] for t in TOOL_TEMPLATES])
def test_openai_tool_arguments_take_the_form_the_template_reads(name, template, form):
    rng = random.Random(7)
    for _ in range(150):
        context = conversation(rng)
        served = json.loads(dcp._dcp._openai_chat_messages(json.dumps(context["messages"]), template))
        got = rendered(template, {**context, "messages": served})
        want_messages = vllm_messages(context["messages"]) if form == "mapping" else context["messages"]
        want = reference(template, {**context, "messages": want_messages})
        assert not isinstance(want, tuple) and got == want, f"{name}: {got!r} != {want!r}"


@pytest.mark.parametrize("name,template,form", TOOL_TEMPLATES, ids=[t[0] for t in TOOL_TEMPLATES])
def test_arguments_given_as_objects_take_the_form_the_template_reads(name, template, form):
    # As transformers' documentation writes them (and Python callers of LLM.chat pass them): a
    # mapping template takes the object; any other takes the text json.dumps writes of it, which
    # is what a template testing the type would have written with tojson.
    rng = random.Random(11)
    for _ in range(100):
        context = conversation(rng)
        as_objects = vllm_messages(context["messages"])
        served = json.loads(dcp._dcp._openai_chat_messages(json.dumps(as_objects), template))
        got = rendered(template, {**context, "messages": served})
        want_messages = json.loads(json.dumps(as_objects))
        if form == "string":
            for m in want_messages:
                for c in m.get("tool_calls") or []:
                    c["function"]["arguments"] = json.dumps(c["function"]["arguments"],
                                                            ensure_ascii=False)
        want = reference(template, {**context, "messages": want_messages})
        assert not isinstance(want, tuple) and got == want, f"{name}: {got!r} != {want!r}"
    if form == "string" and "is string" in template:  # the object itself renders alike there
        assert reference(template, {**context, "messages": as_objects}) == got


def test_vllms_parsed_arguments_break_a_concatenating_template():
    # Why such a template keeps the string: with vLLM's objects Jinja2 itself fails on it.
    rng = random.Random(3)
    context = conversation(rng)
    while not any(m.get("tool_calls") for m in context["messages"]):
        context = conversation(rng)
    failed = reference(CONCATENATED, {**context, "messages": vllm_messages(context["messages"])})
    assert isinstance(failed, tuple) and failed[1] == "TypeError", failed


def test_arguments_a_mapping_template_cannot_read_are_refused_by_name():
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]
    with pytest.raises(ValueError, match=r"messages\[1\]\.tool_calls\[1\]\.function\.arguments "
                                         r"must be a JSON object, not array"):
        dcp._dcp._openai_chat_messages(json.dumps(messages), TOJSON_ARGUMENTS)
    # The string template takes them as they are.
    assert json.loads(dcp._dcp._openai_chat_messages(json.dumps(messages), CONCATENATED)) == messages


# Random expressions over Jinja's operators, filters, tests, methods and subscripts, each rendered
# by both. Left out: what Jinja makes lazy generators of (select, reject, map, unique, items and
# reverse are always followed by |list here; a bare generator is truthy and prints as an object),
# dict views printed bare, printf-style % on strings (dcp refuses it), and slices of constants.
ATOMS = ["1", "0", "-2", "2.5", "1e3", "'ab'", "'A b'", "''", "'ß'", "'ǅx Σ'", "none", "true",
         "false", "[1, 2]", "['b', 'a']", "[]", "{'k': 1, 'j': [2]}", "{}", "(1, 'x')", "x", "y", "s",
         "d", "l", "undefined_name"]
OPERATORS = ["+", "-", "*", "/", "//", "**", "~", "==", "!=", "<", ">", "<=", ">=", "and", "or",
             "in", "not in"]
FILTERS = ["length", "upper", "lower", "title", "capitalize", "trim", "string", "list", "first",
           "last", "int", "float", "abs", "round", "tojson", "join", "sort", "min", "max", "sum",
           "dictsort", "default('d')", "join(',')", "indent(2)", "round(1)", "replace('a', 'z')",
           "sort(reverse=true)", "unique|list", "select|list", "reject|list", "map('upper')|list",
           "items|list", "reverse|list", "int(7)", "float(1.5)", "trim('a')", "capitalize|length"]
TESTS = ["defined", "none", "string", "number", "integer", "float", "mapping", "sequence",
         "iterable", "odd", "even", "true", "false", "boolean", "divisibleby 2", "in [1, 'ab']",
         "eq 1", "gt 0", "callable", "sameas none", "le 'b'"]
METHODS = ["upper()", "lower()", "strip()", "split()", "split('b')", "startswith('a')",
           "endswith('b')", "replace('a', 'c')", "title()", "capitalize()", "find('b')",
           "count('a')", "rsplit(none, 1)", "splitlines()", "items()|list", "keys()|list",
           "values()|list", "get('k')", "get('z', 5)", "rfind('a')", "lstrip('a')",
           "removeprefix('a')", "index(1)", "count(1)", "join(['p', 'q'])"]


def expression(rng, depth=0):
    c = rng.random()
    if depth > 3 or c < 0.3:
        return rng.choice(ATOMS)
    inner = lambda: expression(rng, depth + 1)  # noqa: E731
    if c < 0.5:
        return f"({inner()} {rng.choice(OPERATORS)} {inner()})"
    if c < 0.65:
        return f"{inner()}|{rng.choice(FILTERS)}"
    if c < 0.75:
        return f"({inner()} is {rng.choice(['', 'not '])}{rng.choice(TESTS)})"
    if c < 0.85:  # parenthesized: Jinja reads x|f.m as a filter named "f.m"
        return f"({inner()}).{rng.choice(METHODS)}"
    if c < 0.9:  # on what depends on a variable: Jinja folds constants, and a failed fold of a
        # literal's slice renders empty where the same slice at run time raises
        subscript = rng.choice(['0', '-1', '1:', '::-1', chr(39) + 'k' + chr(39)])
        return f"({inner()} if x else {inner()})[{subscript}]"
    if c < 0.95:
        return f"({inner()} if {inner()} else {inner()})"
    return f"(not {inner()})"


@pytest.mark.parametrize("seed", range(4))
def test_random_expressions_evaluate_as_jinja2_evaluates_them(seed):
    rng = random.Random(1000 + seed)
    context = {"x": 3, "y": "Hello World", "s": "a  b\tc", "d": {"k": "v", "a": 2}, "l": [3, 1, 2]}
    compared = 0
    for _ in range(1500):
        template = "{{ " + expression(rng) + " }}"
        want, got = reference(template, context), rendered(template, context)
        assert same(got, want), f"{template}: dcp {got!r}, Jinja2 {want!r}"
        compared += not isinstance(want, tuple)
    assert compared >= 500, f"only {compared} expressions rendered"


def test_floats_print_as_python_repr_and_json_dumps_write_them():
    import struct
    rng = random.Random(3)
    values = [0.0004, 0.0001, 0.00001, 1e15, 1e16, 1.5e16, 1e-7, 1e22, 1e100, 1e-100, 5e-324,
              1.7976931348623157e308, -0.0, 0.0, 2.5, -1234.5678, 0.1, 1 / 3, 100.0, 1e5]
    for _ in range(5000):
        values.append(struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0])
        values.append(rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30))
    values = [v for v in values if v == v and abs(v) != float("inf")]
    for start in range(0, len(values), 500):
        part = values[start:start + 500]
        got = rendered("{% for v in vals %}{{ v }} {{ v|tojson }};{% endfor %}", {"vals": part})
        assert got == "".join(f"{v!r} {json.dumps(v)};" for v in part)
