"""The vendors' SDKs against the gateway (tests/llm_tokens.rs runs this).

Argument: the gateway's base URL. Prints one line per call, `name value`,
which the Rust test checks against what the gateway charged.
"""
import sys
import time

import anthropic
import openai

base = sys.argv[1]
messages = [{"role": "user", "content": "hi"}]

o = openai.OpenAI(base_url=base + "/v1", api_key="test", max_retries=0)
r = o.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=30)
print("openai", r.usage.total_tokens, r.choices[0].message.content)
last = None
for chunk in o.chat.completions.create(
    model="gpt-4o-mini",
    messages=messages,
    max_tokens=40,
    stream=True,  # no stream_options: the gateway asks for the usage
):
    last = chunk
print("openai-stream", last.usage.total_tokens)

a = anthropic.Anthropic(base_url=base, api_key="test", max_retries=0)
m = a.messages.create(model="claude-x", max_tokens=50, messages=messages)
u = m.usage
print("anthropic", u.input_tokens + u.cache_read_input_tokens + u.output_tokens, m.content[0].text)
with a.messages.stream(model="claude-x", max_tokens=60, messages=messages) as s:
    final = s.get_final_message()
u = final.usage
print("anthropic-stream", u.input_tokens + u.cache_read_input_tokens + u.output_tokens)

# Past the budget: the SDKs' own rate-limit errors, with our message.
try:
    o.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=5000)
    print("openai-refused none")
except openai.RateLimitError as e:
    print("openai-refused", e.status_code, e.body["code"], "|", e.message)
try:
    a.messages.create(model="claude-x", max_tokens=5000, messages=messages)
    print("anthropic-refused none")
except anthropic.RateLimitError as e:
    print("anthropic-refused", e.status_code, e.body["error"]["type"], "|", e.message)

# The SDKs' own retry waits what the refusal's retry-after says: under a
# token bucket refilling 200 a second, the second call's reservation fits
# again only about 1.5 s later; the SDKs' own first backoff, without the
# header, would be at most 0.5 s, and their one retry would be refused.
o = openai.OpenAI(base_url=base + "/r/v1", api_key="test", max_retries=1)
a = anthropic.Anthropic(base_url=base + "/r", api_key="test", max_retries=1)
for name, call in [
    ("openai", lambda: o.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=300)),
    ("anthropic", lambda: a.messages.create(model="claude-x", max_tokens=300, messages=messages)),
]:
    call()
    started = time.monotonic()
    call()
    print(name + "-retried", round(time.monotonic() - started, 3))
