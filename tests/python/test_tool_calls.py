"""MiniCPM3's tool calls (Python between <|tool_call_start|> and <|tool_call_end|>) read by dcp
against Python itself: random call blocks (every string quote form and escape, integers and
floats spelt every way Python takes them, nested lists, tuples and dicts, comments, fences,
several calls) and mutations of them, each parsed by `ast` and turned into arguments as vLLM's
MiniCPM3 reader does (keyword values, a bare name as its text), then `json.dumps`; dcp must give
the same calls, or read no call where Python does not read one (and none where a string names a
character by its Unicode name, `\\N{...}`, which dcp does not read)."""
import ast
import json
import math
import random
import warnings

import pytest

import dcp

BEGIN, END = "<|tool_call_start|>", "<|tool_call_end|>"


def reference_value(node):
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
            return v
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError("JSON cannot hold it")
            return v
        raise ValueError(f"not read: {type(v)}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = reference_value(node.operand)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("a sign on a non-number")
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, (ast.List, ast.Tuple)):
        return [reference_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        out = {}
        for k, v in zip(node.keys, node.values):
            if k is None:
                raise ValueError("**")
            key = reference_value(k)
            if not isinstance(key, str) or not isinstance(k, ast.Constant):
                raise ValueError("a key that is not a string")
            out[key] = reference_value(v)
        return out
    if isinstance(node, ast.Name):
        return node.id
    raise ValueError(f"not read: {type(node)}")


def dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return None if inner is None else inner + "." + node.attr
    return None


def reference(block):
    """[(name, arguments JSON)] as Python reads the block, or None where it reads no calls."""
    code = block.strip()
    if code.startswith("```"):
        code = code[3:].strip()
        if code.startswith("python"):
            code = code[6:].strip()
    if code.endswith("```"):
        code = code[:-3].strip()
    if "\\N{" in code:  # a character by its Unicode name: dcp has no name table, reads no call
        return None
    try:
        with warnings.catch_warnings():  # an unknown escape such as \d warns; it is kept
            warnings.simplefilter("ignore")
            tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    calls = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
            return None
        call = stmt.value
        name = dotted(call.func)
        if name is None or call.args:
            return None
        args = {}
        for kw in call.keywords:
            if kw.arg is None:
                return None
            try:
                args[kw.arg] = reference_value(kw.value)
            except (ValueError, RecursionError):
                return None
        try:
            text = json.dumps(args, ensure_ascii=False)
            text.encode("utf-8")  # a lone surrogate has no UTF-8
        except (UnicodeEncodeError, ValueError):
            return None
        calls.append((name, text))
    return calls or None


CHARS = list("abc xyz019") + ["'", '"', "\\", "\n", "\t", "\r", "é", "日本", "😀", "\x00", "\x7f",
                              "\u2028", "{", "}", "#", "<", "|"]
NAMES = ["city", "unit", "q", "n", "x_1", "_private", "Data", "lat", "items", "sub"]
FUNCS = ["get_weather", "search", "a.b.c", "tools.run", "f", "_g2"]


def string_literal(rng):
    text = "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 8)))
    form = rng.random()
    if form < 0.25:
        return repr(text)
    if form < 0.35:  # raw: backslashes kept, no quote or newline inside
        body = "".join(rng.choice(list("ab \\x1n")) for _ in range(rng.randint(0, 6)))
        if body.endswith("\\"):
            body += "z"
        q = rng.choice(["'", '"'])
        return rng.choice(["r", "R"]) + q + body + q
    quote = rng.choice(["'", '"', "'''", '"""'])
    prefix = rng.choice(["", "", "u", "U"])
    out = []
    for ch in text:
        must = ch == "\\" or (ch == quote[0]) or (len(quote) == 1 and ch in "\n\r") or ch == "\r"
        if must or rng.random() < 0.3:
            cp = ord(ch)
            kinds = ["x"] if cp < 256 else []
            kinds += ["u"] if cp < 0x10000 else []
            kinds += ["U", "simple"]
            if cp < 0o400:
                kinds.append("octal")
            kind = rng.choice(kinds)
            if kind == "simple":
                simple = {"\\": "\\\\", "'": "\\'", '"': '\\"', "\n": "\\n", "\t": "\\t",
                          "\r": "\\r", "\x00": "\\0"}
                out.append(simple.get(ch, f"\\U{cp:08x}"))
            elif kind == "x":
                out.append(f"\\x{cp:02x}")
            elif kind == "u":
                out.append(f"\\u{cp:04X}")
            elif kind == "U":
                out.append(f"\\U{cp:08x}")
            else:
                out.append(f"\\{cp:o}" if rng.random() < 0.5 else f"\\{cp:03o}")
        else:
            out.append(ch)
    body = "".join(out)
    if len(quote) == 3 and body.endswith(quote[0]) and not body.endswith("\\" + quote[0]):
        body += " "
    extra = ""
    if rng.random() < 0.15:  # implicit concatenation, across whitespace
        extra = rng.choice([" ", "", "\n  "]) + repr("+")
    if rng.random() < 0.05:
        body += rng.choice(["\\d", "\\w", "\\\n"])  # an unknown escape kept, a joined line
    return prefix + quote + body + quote + extra


def number_literal(rng):
    r = rng.random()
    sign = rng.choice(["", "", "-", "+", "- ", "--"])
    if r < 0.4:
        digits = str(rng.choice([0, 7, 42, 10**6, rng.randint(0, 10**30)]))
        if len(digits) > 3 and rng.random() < 0.5:
            digits = digits[0] + "_" + digits[1:]
        return sign + digits
    forms = ["1.5", ".5", "5.", "1e10", "1.5E-3", "1_000.25", "1e308", "2.5e-320", "1e-400",
             "123456789012345678.0", "0.1", "1e16", "1e15", "0.0001", "0.00001", "3.141592653589793",
             "1e22", "0.0", "100.0e-2", "9007199254740993.0", str(rng.uniform(-1e6, 1e6)),
             repr(rng.random() * 10 ** rng.randint(-30, 30)), "1e400"]
    return sign + rng.choice(forms)


def value_literal(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.35:
        return string_literal(rng)
    if r < 0.55:
        return number_literal(rng)
    if r < 0.62:
        return rng.choice(["True", "False", "None", "celsius", "fahrenheit"])
    sep = rng.choice([", ", ",", " ,\n  ", ", # note\n"])
    items = [value_literal(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    trailing = "," if items and rng.random() < 0.3 else ""
    if r < 0.75:
        return "[" + sep.join(items) + trailing + "]"
    if r < 0.85:
        if len(items) == 1 and not trailing:
            trailing = "," if rng.random() < 0.7 else ""  # (x) is x itself
        return "(" + sep.join(items) + trailing + ")"
    pairs = [string_literal(rng) + rng.choice([": ", ":", " : "]) + value_literal(rng, depth + 1)
             for _ in range(rng.randint(0, 3))]
    return "{" + sep.join(pairs) + ("," if pairs and rng.random() < 0.3 else "") + "}"


def call_source(rng):
    names = rng.sample(NAMES, rng.randint(0, 4))
    sep = rng.choice([", ", ",", ",\n    "])
    args = sep.join(n + rng.choice(["=", " = "]) + value_literal(rng) for n in names)
    return rng.choice(FUNCS) + "(" + args + ("," if names and rng.random() < 0.2 else "") + ")"


BREAKERS = ["f(1)", "f(a=g())", "f(a={1, 2})", "f(a=b'x')", "f(a=f'x')", "f(a=1j)",
            "f(**k)", "f(a=0x10)", "f(a=01)", "f(a='x)", "  f(a=1)", "f(a=1, a=2)",
            "f(a=1 + 2)", "f(a=x.y)", "f(a=x[0])", "x = f(a=1)", "f(a=-'x')", "f(a={1: 2})",
            "f(a='\\N{BULLET}')", "f(a='\\ud800')", "f(a=1__0)", "f(a=[1, 2)", "if(a=1)",
            "f(a=lambda: 1)", "f(a==1)", "f(a=1);;", "f(a=-True)"]


def random_block(rng):
    calls = [call_source(rng) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.15:
        calls.insert(rng.randrange(len(calls) + 1), rng.choice(BREAKERS))
    code = ""
    for k, c in enumerate(calls):
        if k:
            code += rng.choice(["\n", "; ", ";\n", "\n\n", "\n# next\n", "  # why\n"])
        code += c
    if rng.random() < 0.6:
        code = "```python\n" + code + "\n```"
    if rng.random() < 0.1 and code:  # a mutation: a character dropped or doubled
        k = rng.randrange(len(code))
        code = code[:k] + code[k + 1:] if rng.random() < 0.5 else code[:k] + code[k] + code[k:]
    return rng.choice(["", "\n", " "]) + code + rng.choice(["", "\n"])


def test_minicpm3_calls_read_as_python_reads_them():
    rng = random.Random(5)
    compared = read = 0
    for _ in range(3000):
        block = random_block(rng)
        text = "thinking" + BEGIN + block + END + "\nanswer"
        want = reference(block)
        content, calls = dcp.parse_tool_calls(text, "minicpm3")
        if want is None:
            assert calls == [] and content == text, (block, calls)
        else:
            read += 1
            assert [(c["name"], c["arguments"]) for c in calls] == want, block
            assert content == "thinking\nanswer"
            for c in calls:
                json.loads(c["arguments"])  # valid JSON (no NaN, no Infinity)
        compared += 1
    # Most blocks read; the breakers and mutations make the rest.
    assert read > compared * 0.6, (read, compared)
    assert read < compared, (read, compared)


def test_minicpm3_calls_by_hand():
    # A keyword as an argument's name, as vLLM's reader accepts it; fences; several calls.
    text = (BEGIN + "\n```python\nbook(from='Paris', class=1, to=\"Lyon\")\nnow()\n```\n" + END +
            "Booked.")
    content, calls = dcp.parse_tool_calls(text, "minicpm3")
    assert content == "Booked."
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("book", '{"from": "Paris", "class": 1, "to": "Lyon"}'), ("now", "{}")]
    # Still open: no call yet, all content.
    open_text = BEGIN + "f(a=1)"
    assert dcp.parse_tool_calls(open_text, "minicpm3") == (open_text, [])
    with pytest.raises(ValueError, match="legal: deepseek_v3, kimi_k2, minicpm3"):
        dcp.parse_tool_calls("x", "hermes")


def test_every_format_reads_what_its_template_writes():
    # DeepSeek V3.1 and Kimi K2 read through the same function (their own tests are in C++).
    ds = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get<｜tool▁sep｜>{\"a\": 1}"
          "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    assert dcp.parse_tool_calls("x" + ds, "deepseek_v3") == (
        "x", [{"id": "", "name": "get", "arguments": '{"a": 1}'}])
    kimi = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get:0"
            "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>")
    assert dcp.parse_tool_calls(kimi, "kimi_k2") == (
        "", [{"id": "functions.get:0", "name": "get", "arguments": "{}"}])
