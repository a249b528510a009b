"""Drive the official OpenAI Python client's common calls against a running `ft serve`.

Each case sends one request with the fields clients commonly set and checks it either
succeeds (and, where the server accepts a field but ignores it, that the response header
`ft-ignored-fields` names it) or fails with HTTP 400 whose error names the field (`param`).
Prints one JSON object per case and a summary; exits 1 if any case did not behave as
docs/serve.md says.

Usage: python3 check.py BASE_URL [IDS_OUT]   (BASE_URL like http://127.0.0.1:8000/v1)
"""
import json
import sys

import openai

base = sys.argv[1]
ids_out = sys.argv[2] if len(sys.argv) > 2 else None
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)
model = client.models.list().data[0].id
msgs = [{"role": "user", "content": "Say hello"}]

# (name, endpoint, kwargs, expected): expected is "ok", ("ignored", [fields]) or
# (status, param).
CASES = [
    ("chat", "chat", dict(messages=msgs, max_tokens=8), "ok"),
    ("chat stream + usage", "chat-stream",
     dict(messages=msgs, max_tokens=8, stream_options={"include_usage": True}), "ok"),
    ("completion", "completions", dict(prompt="Hello", max_tokens=8), "ok"),
    ("completion stream", "completions-stream", dict(prompt="Hello", max_tokens=8), "ok"),
    ("penalties 0", "chat", dict(messages=msgs, max_tokens=4, frequency_penalty=0,
                                 presence_penalty=0), "ok"),
    ("penalties set", "chat", dict(messages=msgs, max_tokens=4, frequency_penalty=0.5,
                                   presence_penalty=0.3),
     ("ignored", ["frequency_penalty", "presence_penalty"])),
    ("completion penalty", "completions", dict(prompt="Hi", max_tokens=4, frequency_penalty=1.0),
     ("ignored", ["frequency_penalty"])),
    ("seed", "chat", dict(messages=msgs, max_tokens=6, seed=42, temperature=0.9), "ok"),
    ("stop", "chat", dict(messages=msgs, max_tokens=6, stop=["\n", "zz"]), "ok"),
    ("user", "chat", dict(messages=msgs, max_tokens=4, user="alice"), "ok"),
    ("response_format text", "chat", dict(messages=msgs, max_tokens=4,
                                          response_format={"type": "text"}), "ok"),
    ("max_completion_tokens", "chat", dict(messages=msgs, max_completion_tokens=5), "ok"),
    ("store + metadata", "chat", dict(messages=msgs, max_tokens=4, store=True,
                                      metadata={"run": "check"}), ("ignored", ["store"])),
    ("reasoning_effort", "chat", dict(messages=msgs, max_tokens=4, reasoning_effort="low"),
     ("ignored", ["reasoning_effort"])),
    ("logprobs false", "chat", dict(messages=msgs, max_tokens=4, logprobs=False), "ok"),
    ("n=2", "chat", dict(messages=msgs, max_tokens=4, n=2), (400, "n")),
    ("logprobs", "chat", dict(messages=msgs, max_tokens=4, logprobs=True, top_logprobs=2),
     (400, "logprobs")),
    ("top_logprobs", "chat", dict(messages=msgs, max_tokens=4, top_logprobs=2),
     (400, "top_logprobs")),
    ("response_format json", "chat", dict(messages=msgs, max_tokens=4,
                                          response_format={"type": "json_object"}),
     (400, "response_format")),
    ("logit_bias", "chat", dict(messages=msgs, max_tokens=4, logit_bias={"50256": -100}),
     (400, "logit_bias")),
    ("tools", "chat", dict(messages=msgs, max_tokens=4, tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {}}}}]), (400, "tools")),
    ("temperature 3", "chat", dict(messages=msgs, max_tokens=4, temperature=3),
     (400, "temperature")),
    ("unknown field", "chat", dict(messages=msgs, max_tokens=4, extra_body={"frobnicate": 1}),
     (400, "frobnicate")),
    ("completion logprobs", "completions", dict(prompt="Hi", max_tokens=4, logprobs=2),
     (400, "logprobs")),
    ("completion echo", "completions", dict(prompt="Hi", max_tokens=4, echo=True),
     (400, "echo")),
    ("completion best_of", "completions", dict(prompt="Hi", max_tokens=4, best_of=2),
     (400, "best_of")),
    ("completion n=3", "completions", dict(prompt="Hi", max_tokens=4, n=3), (400, "n")),
    ("context exceeded", "completions", dict(prompt="Hi", max_tokens=100000),
     (400, "max_tokens")),
    ("unknown model", "chat-model", dict(messages=msgs, max_tokens=4, model="gpt-9"),
     (404, "model")),
]


def call(endpoint, kwargs):
    """(status, ignored header, ids, text) of one call; raises the client's errors."""
    kw = dict(kwargs)
    kw.setdefault("model", model)
    if endpoint in ("chat", "chat-model"):
        raw = client.chat.completions.with_raw_response.create(**kw)
        r = raw.parse()
        return raw.headers.get("ft-ignored-fields"), [r.id], r.choices[0].message.content, r.usage
    if endpoint == "completions":
        raw = client.completions.with_raw_response.create(**kw)
        r = raw.parse()
        return raw.headers.get("ft-ignored-fields"), [r.id], r.choices[0].text, r.usage
    if endpoint == "chat-stream":
        text, ids, usage = "", set(), None
        for c in client.chat.completions.create(stream=True, **kw):
            ids.add(c.id)
            if c.choices:
                text += c.choices[0].delta.content or ""
            if c.usage:
                usage = c.usage
        return None, sorted(ids), text, usage
    if endpoint == "completions-stream":
        text, ids = "", set()
        for c in client.completions.create(stream=True, **kw):
            ids.add(c.id)
            text += c.choices[0].text if c.choices else ""
        return None, sorted(ids), text, None
    raise ValueError(endpoint)


failures = 0
all_ids = []
seeded = []
for name, endpoint, kwargs, expected in CASES:
    row = {"case": name, "expected": expected}
    try:
        ignored, ids, text, usage = call(endpoint, kwargs)
        all_ids += ids
        row.update(status=200, ignored=ignored, ids=len(ids), chars=len(text or ""))
        if usage is not None:
            row["completion_tokens"] = usage.completion_tokens
        if name == "seed":
            seeded.append(text)
            seeded.append(call(endpoint, kwargs)[2])
            row["seed_reproducible"] = seeded[0] == seeded[1]
        if expected == "ok":
            ok = ignored is None and len(ids) == 1 and row.get("seed_reproducible", True)
        elif expected[0] == "ignored":
            ok = ignored is not None and sorted(f.strip() for f in ignored.split(",")) == sorted(expected[1])
        else:
            ok = False
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error", body)
        row.update(status=e.status_code, param=err.get("param"), message=err.get("message"),
                   type=err.get("type"))
        ok = (isinstance(expected, tuple) and expected[0] == e.status_code
              and err.get("param") == expected[1] and expected[1] in (err.get("message") or ""))
    except openai.APIError as e:
        row.update(status=None, error=f"{type(e).__name__}: {e}")
        ok = False
    row["ok"] = ok
    failures += 0 if ok else 1
    print(json.dumps(row, default=str), flush=True)

unique = len(set(all_ids)) == len(all_ids)
print(json.dumps({"summary": True, "cases": len(CASES), "failed": failures,
                  "response_ids": len(all_ids), "ids_unique": unique,
                  "openai_client": openai.__version__}))
if ids_out:
    with open(ids_out, "w") as f:
        f.write("\n".join(all_ids) + "\n")
sys.exit(0 if failures == 0 and unique else 1)
