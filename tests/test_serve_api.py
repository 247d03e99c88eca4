"""``serve``'s OpenAI-compatible API, spoken to by the real ``openai`` client over a live
server on 127.0.0.1 (a background thread, a free port), with a debug GPT trained here.

References are independent of the server: ``GPT.generate`` with the same seed (what
``minitransformer sample`` writes) and the uncached model's log-softmax. Every bad request
must get its status and an error in OpenAI's shape, and the server must keep serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from minitransformer.cli import main
from minitransformer.families import load_run
from minitransformer.nn import linear as linear_mod
from minitransformer.serve import Settings, create_app, running
from minitransformer.training.checkpoint import write_model_files

openai = pytest.importorskip("openai", reason="openai is in the test extra")

PROMPT = "To be"
TINY_TEXT = "".join(f"{i}: To be, or not to be: that is the question. The lazy dog.\n"
                    for i in range(60))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    data = root / "tiny.txt"
    data.write_text(TINY_TEXT, encoding="utf-8")  # the words of PROMPT and more
    assert main(["train", "--data", str(data), "--out", str(root / "tiny"), "--preset", "debug",
                 "--max_iters", "4", "--eval_interval", "2", "--eval_iters", "2",
                 "--sample_tokens", "0", "--quiet"]) == 0
    return load_run(root / "tiny")


@pytest.fixture(scope="module")
def url(run):
    app = create_app(run, Settings(model_id="tiny", max_tokens=64, max_body=32 * 1024))
    with running(app) as u:
        yield u


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=30)


def reference(run, prompt: str, n: int, seed: int, temperature: float = 1.0,
              top_p: float | None = None) -> str:
    """What ``minitransformer sample --seed`` writes for this prompt (batch of one)."""
    idx = torch.tensor([run.tokenizer.encode(prompt)])
    out = run.model.generate(idx, n, temperature, None, top_p, seed)
    return run.tokenizer.decode(out[0, idx.shape[1]:].tolist())


def post(url: str, body: bytes, headers: dict | None = None,
         path: str = "v1/completions") -> tuple[int, dict]:
    req = urllib.request.Request(url + path, data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def assert_openai_error(body: dict) -> None:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], body


def still_serving(client) -> None:
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, seed=0)
    assert len(r.choices[0].text) == 3


def test_the_page_opens_with_a_prompt_of_the_runs_own_corpus(url, tmp_path):
    """/api/info: the first line of the run's corpus as the prompt (a Chinese model's page
    once opened with ROMEO:, which it cannot read); ROMEO: where the corpus is not here."""
    with urllib.request.urlopen(url + "api/info", timeout=10) as r:
        info = json.loads(r.read())
    assert info["prompt"] == "0: To be, or"  # 16 characters at most, cut at a space


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_completion_is_the_seeded_sample(client, run):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, temperature=0.8,
                                  top_p=0.9, seed=7)
    assert r.object == "text_completion" and r.model == "tiny"
    assert r.choices[0].text == reference(run, PROMPT, 20, 7, 0.8, 0.9)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(PROMPT) and r.usage.completion_tokens == 20


def test_a_choice_that_draws_the_models_end_token_stops_there(run, monkeypatch):
    """The family's end token (<|endoftext|>, Llama's </s>; tests/test_special_tokens.py)
    ends a choice: finish_reason "stop", the token not in the text but counted, as OpenAI's
    models stop at theirs. Here the end is the third token the seeded sample draws."""
    drawn = run.tokenizer.encode(reference(run, PROMPT, 3, 7))
    monkeypatch.setattr(type(run.family), "end_tokens",
                        lambda self, tok, meta: frozenset({drawn[2]}))
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 10, "seed": 7, "logprobs": 0}
    with running(create_app(run, Settings(model_id="tiny"))) as u:
        for stream in (False, True):
            if stream:
                status, text = 200, ""
                req = urllib.request.Request(u + "v1/completions", method="POST",
                                             data=json.dumps({**body, "stream": True}).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    chunks = [json.loads(line[6:]) for line in r.read().decode().split("\n\n")
                              if line.startswith("data: {")]
                text = "".join(c["choices"][0]["text"] for c in chunks)
                assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
            else:
                status, done = post(u, json.dumps(body).encode())
                text = done["choices"][0]["text"]
                assert done["choices"][0]["finish_reason"] == "stop"
                assert done["usage"]["completion_tokens"] == 3
                assert len(done["choices"][0]["logprobs"]["tokens"]) == 2
            assert status == 200 and text == run.tokenizer.decode(drawn[:2])


def test_same_seed_same_text_and_n_choices_seeded_seed_plus_i(client, run):
    a = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, n=2, seed=3)
    b = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, n=2, seed=3)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [reference(run, PROMPT, 12, 3 + i) for i in range(2)]
    assert a.usage.prompt_tokens == len(PROMPT)  # the prompt once, whatever n
    assert a.usage.completion_tokens == 24


def test_null_for_the_options_openai_takes_null_for_is_their_default(url, run):
    """OpenAI's API takes null for these (a client may send every option it has); they were
    400s while max_tokens took null."""
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "seed": 4}
    status, plain = post(url, json.dumps(body).encode())
    nulls = {**body, **dict.fromkeys(("temperature", "top_p", "n", "stream", "echo",
                                      "presence_penalty", "frequency_penalty"))}
    status_nulls, answer = post(url, json.dumps(nulls).encode())
    assert (status, status_nulls) == (200, 200), answer
    assert [c["text"] for c in answer["choices"]] == [c["text"] for c in plain["choices"]] \
        == [reference(run, PROMPT, 6, 4)]


def test_a_list_of_prompts(client, run):
    r = client.completions.create(model="tiny", prompt=[PROMPT, "the"], max_tokens=5, seed=2)
    assert [c.text for c in r.choices] == [reference(run, p, 5, 2) for p in (PROMPT, "the")]


def test_an_empty_prompt_is_refused_where_the_model_has_no_start_token(url):
    """A char run has no start token to begin from (a Llama's "" is its <s>)."""
    status, body = post(url, json.dumps({"model": "tiny", "prompt": ""}).encode())
    assert status == 400 and body["error"]["code"] == "empty_prompt", body
    assert_openai_error(body)


def test_prompts_as_token_ids(client, run):
    ids = run.tokenizer.encode(PROMPT)
    one = client.completions.create(model="tiny", prompt=ids, max_tokens=5, seed=2)
    assert one.choices[0].text == reference(run, PROMPT, 5, 2)
    two = client.completions.create(model="tiny", prompt=[ids, run.tokenizer.encode("the")],
                                    max_tokens=5, seed=2)
    assert [c.text for c in two.choices] == [reference(run, p, 5, 2) for p in (PROMPT, "the")]
    with pytest.raises(openai.BadRequestError, match="not in the vocabulary"):
        client.completions.create(model="tiny", prompt=[ids[0], 10 ** 6], max_tokens=2)
    still_serving(client)


def test_streaming_gives_the_same_text_in_chunks(client, run):
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16,
                                            seed=5, stream=True))
    assert len(chunks) >= 16
    assert "".join(c.choices[0].text for c in chunks) == reference(run, PROMPT, 16, 5)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def events(url: str, body: dict) -> list:
    """A streamed completion read raw: each event's chunk as JSON, the last "[DONE]"."""
    req = urllib.request.Request(url + "v1/completions", data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        data = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


def test_stream_options_include_usage_ends_the_stream_with_the_usage(url, client, run):
    """OpenAI's ``stream_options: {"include_usage": true}``: one more chunk before [DONE], with
    no choices and the usage of the whole request (each prompt counted once); every other
    chunk carries ``usage: null``. Without it, no chunk has a usage field."""
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, n=2,
                                            seed=5, stream=True,
                                            stream_options={"include_usage": True}))
    *texts, last = chunks
    assert last.choices == [] and all(c.usage is None for c in texts)
    assert (last.usage.prompt_tokens, last.usage.completion_tokens,
            last.usage.total_tokens) == (len(PROMPT), 12, len(PROMPT) + 12)
    for i in range(2):
        assert "".join(c.choices[0].text for c in texts if c.choices[0].index == i) == \
            reference(run, PROMPT, 6, 5 + i)
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "seed": 1, "stream": True}
    raw = events(url, {**body, "stream_options": {"include_usage": True}})
    assert raw[-1] == "[DONE]" and raw[-2]["choices"] == [] and raw[-2]["usage"] == {
        "prompt_tokens": len(PROMPT), "completion_tokens": 3, "total_tokens": len(PROMPT) + 3}
    assert all("usage" in c and c["usage"] is None for c in raw[:-2])
    plain = events(url, body)
    assert plain[-1] == "[DONE]" and all("usage" not in c for c in plain[:-1])
    assert [c["choices"] for c in plain[:-1]] == [c["choices"] for c in raw[:-2]]


def test_an_error_after_the_stream_began_is_one_openai_shaped_event(url, client,
                                                                     monkeypatch):
    """Headers gone, a failure is an event in OpenAI's error shape, then [DONE]; the server
    goes on serving. A vanishing temperature, which once failed so, is greedy decoding."""
    greedy = {"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    want = post(url, json.dumps(greedy).encode())[1]["choices"][0]["text"]
    tiny = post(url, json.dumps({**greedy, "temperature": 1e-40}).encode())
    assert tiny[0] == 200 and tiny[1]["choices"][0]["text"] == want

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("minitransformer.serve.completions.sample_next", broken)  # batched
    monkeypatch.setattr("minitransformer.models.generation.sample_next", broken)  # alone
    raw = events(url, {**greedy, "stream": True, "temperature": 1})
    assert raw[-1] == "[DONE]"
    assert_openai_error(raw[-2])
    assert raw[-2]["error"]["code"] == "internal_error" and raw[-2]["error"]["type"] == \
        "server_error"
    monkeypatch.undo()
    still_serving(client)


def test_stop_cuts_the_text_and_streaming_never_shows_a_stop_start(client, run):
    full = reference(run, PROMPT, 40, 11)
    stop = full[10:13]
    expected = full[:full.index(stop)]
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, seed=11,
                                  stop=[stop, "\x00never"])
    assert (r.choices[0].text, r.choices[0].finish_reason) == (expected, "stop")
    shown = ""
    for c in client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, seed=11,
                                       stop=stop, stream=True):
        shown += c.choices[0].text
        assert stop not in shown and len(shown) <= len(expected)
    assert shown == expected


def test_logprobs_are_the_models_own(client, run):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, seed=1,
                                  logprobs=3, temperature=0.7)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 10
    assert lp.text_offset == list(range(len(PROMPT), len(PROMPT) + 10))
    ids = torch.tensor([run.tokenizer.encode(PROMPT + r.choices[0].text)])
    with torch.no_grad():
        logits, _ = run.model(ids)  # (1, T, V), no cache: an independent path
    want = torch.log_softmax(logits[0].float(), dim=-1)[len(PROMPT) - 1:-1]  # (10, V)
    got = torch.tensor(lp.token_logprobs)
    torch.testing.assert_close(got, want.gather(1, ids[0, len(PROMPT):, None])[:, 0],
                               atol=1e-4, rtol=1e-4)
    for row, top, token in zip(want, lp.top_logprobs, lp.tokens, strict=True):
        # the 3 most likely, and the token drawn when it is not one of them (OpenAI's way)
        assert token in top and len(top) == 3 + (list(top).index(token) == 3)
        assert list(top.values()) == sorted(top.values(), reverse=True)
        assert max(top.values()) == pytest.approx(row.max().item(), abs=1e-4)
    # logprobs 0: no others, the token drawn alone (OpenAI's "up to logprobs + 1")
    r0 = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, seed=1,
                                   logprobs=0, temperature=0.7)
    lp0 = r0.choices[0].logprobs
    assert r0.choices[0].text == r.choices[0].text and lp0.token_logprobs == lp.token_logprobs
    assert lp0.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs,
                                                        strict=True)]


def test_concurrent_clients_get_their_own_text(client, run):
    results, errors = {}, []

    def ask(seed):
        try:
            r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, seed=seed)
            results[seed] = r.choices[0].text
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert results == {s: reference(run, PROMPT, 8, s) for s in range(4)}


BAD = {  # name -> (raw body, status, param)
    "malformed JSON": (b'{"model": "tiny", "prompt": ', 400, None),
    "wrong type": (b'{"model": "tiny", "prompt": "a", "max_tokens": "5"}', 400, "max_tokens"),
    "prompt not text": (b'{"model": "tiny", "prompt": 5}', 400, "prompt"),
    "negative temperature": (b'{"model": "tiny", "prompt": "a", "temperature": -1}', 400,
                             "temperature"),
    "max_tokens over the cap": (b'{"model": "tiny", "prompt": "a", "max_tokens": 65}', 400,
                                "max_tokens"),
    "unseen characters": ('{"model": "tiny", "prompt": "a\u2603"}'.encode(), 400, "prompt"),
    "unknown model": (b'{"model": "gpt-4", "prompt": "a"}', 404, "model"),
    "logit_bias": (b'{"model": "tiny", "prompt": "a", "logit_bias": {"3": 100}}', 400,
                   "logit_bias"),
    "best_of": (b'{"model": "tiny", "prompt": "a", "best_of": 3}', 400, "best_of"),
    "suffix": (b'{"model": "tiny", "prompt": "a", "suffix": "b"}', 400, "suffix"),
    "presence_penalty": (b'{"model": "tiny", "prompt": "a", "presence_penalty": 0.5}', 400,
                         "presence_penalty"),
    "oversized body": (json.dumps({"model": "tiny", "prompt": "a" * 40000}).encode(), 413,
                       None),
    "unknown field": (b'{"model": "tiny", "prompt": "a", "foo": 1}', 400, "foo"),
    "too many choices": (json.dumps({"model": "tiny", "prompt": ["a"] * 5, "n": 13}).encode(),
                         400, "n"),
    "seed + n - 1 past 2**63 - 1": (b'{"model": "tiny", "prompt": "a", "n": 2, '
                                    b'"seed": 9223372036854775807}', 400, "seed"),
    "unknown stream option": (b'{"model": "tiny", "prompt": "a", "stream": true, '
                              b'"stream_options": {"bar": true}}', 400, "stream_options.bar"),
    "stream_options without stream": (b'{"model": "tiny", "prompt": "a", "stream_options": '
                                      b'{"include_usage": true}}', 400, "stream_options"),
    "include_obfuscation": (b'{"model": "tiny", "prompt": "a", "stream": true, "stream_options"'
                            b': {"include_obfuscation": true}}', 400,
                            "stream_options.include_obfuscation"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_requests_get_openai_errors(url, client, name):
    body, status, param = BAD[name]
    got, answer = post(url, body)
    assert got == status, answer
    assert_openai_error(answer)
    assert answer["error"]["param"] == param
    still_serving(client)


def test_half_a_surrogate_pair_is_refused_in_every_field_that_holds_text(url, client):
    """JSON can spell a lone surrogate ("\\ud800"): no character, which a BPE run's tokenizer
    failed on as a 500; a stop string of one was taken without a word."""
    for body, param, path in (
            (b'{"model": "tiny", "prompt": "To\\ud800"}', "prompt", "v1/completions"),
            (b'{"model": "tiny", "prompt": ["To", "\\udc80"], "stream": true}', "prompt",
             "v1/completions"),
            (b'{"model": "tiny", "prompt": "To", "stop": "\\ud800"}', "stop", "v1/completions"),
            (b'{"text": "To be\\ud800"}', "text", "api/inspect")):
        status, answer = post(url, body, path=path)
        assert status == 400 and answer["error"]["param"] == param, answer
        assert_openai_error(answer)
        if param != "text":  # "text" (a str with a length) was refused before, in pydantic's words
            assert "surrogate pair alone: not a character" in answer["error"]["message"]
            assert not answer["error"]["message"].split(": ", 1)[1].startswith("Value error")
    still_serving(client)


def test_an_unknown_field_is_refused_by_name(url, client):
    """A field this server does not know is a 400 naming it, in OpenAI's words, never
    ignored; the page's endpoints are as strict."""
    with pytest.raises(openai.BadRequestError,
                       match="Unrecognized request argument supplied: foo"):
        client.completions.create(model="tiny", prompt="a", max_tokens=2, extra_body={"foo": 1})
    status, body = post(url, b'{"text": "To be", "colour": "red"}', path="api/inspect")
    assert status == 400 and body["error"]["param"] == "colour"
    assert_openai_error(body)
    still_serving(client)


def test_json_sent_as_text_is_told_its_content_type(url, client):
    """curl -d without -H 'Content-Type: application/json' sends a form's type: the body is
    JSON in all but its label, which the error names."""
    body = b'{"model": "tiny", "prompt": "a", "max_tokens": 2}'
    for kind in ("text/plain", "application/x-www-form-urlencoded"):
        status, answer = post(url, body, {"Content-Type": kind})
        assert status == 400, answer
        assert_openai_error(answer)
        assert answer["error"]["message"] == (f"the request body must be JSON sent with "
                                              f"Content-Type: application/json (got {kind})")
    assert post(url, body, {"Content-Type": "application/json; charset=utf-8"})[0] == 200
    still_serving(client)


def test_an_empty_body_an_unknown_chat_model_and_the_default_max_tokens(url, client, run):
    for kind in ("application/json", "text/plain"):
        status, answer = post(url, b"", {"Content-Type": kind})
        assert status == 400 and answer["error"]["message"] == \
            "the request body is empty: send a JSON object"
    status, answer = post(url, b'{"model": "gpt-4o", "messages": []}', path="v1/chat/completions")
    assert status == 404 and answer["error"]["code"] == "model_not_found"
    # max_tokens not given: OpenAI's 16, or the server's limit where that is lower
    from minitransformer.serve.completions import plan_completion
    from minitransformer.serve.schemas import CompletionRequest

    def planned(body: dict, cap: int) -> int:
        return plan_completion(CompletionRequest(**body), run.tokenizer, cap, 64).max_tokens

    assert planned({"model": "tiny", "prompt": "a"}, 8) == 8
    assert planned({"model": "tiny", "prompt": "a"}, 64) == 16
    assert planned({"model": "tiny", "prompt": "a", "max_tokens": None}, 8) == 8
    with pytest.raises(Exception, match="this server allows at most 8"):
        planned({"model": "tiny", "prompt": "a", "max_tokens": 16}, 8)
    still_serving(client)


def test_the_client_raises_its_own_error_classes(client):
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tiny", prompt="a", temperature=-0.5)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="a")
    with pytest.raises(openai.BadRequestError, match="not a chat model.*/v1/completions"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                "content": "hi"}])
    still_serving(client)


def test_no_docs_pages_but_openapi(url):
    for path, want in (("docs", 404), ("redoc", 404), ("openapi.json", 200)):
        try:
            status = urllib.request.urlopen(url + path, timeout=10).status
        except urllib.error.HTTPError as e:
            status = e.code
        assert status == want, path


def test_the_server_packs_its_model_once_for_its_life(run, monkeypatch):
    """The worker holds the model's packed weights (nn.linear.packed_weights) from its start
    to its stop: a served model never trains, so they cannot go stale."""
    monkeypatch.setattr(linear_mod, "PACK_MIN_ELEMENTS", 1)  # the debug model's weights too
    app = create_app(run, Settings(model_id="tiny"))
    head = run.model.lm_head
    try:
        seen = asyncio.run(asyncio.wait_for(
            app.state.worker.call(lambda job: head.packed is not None), 20))
    finally:
        app.state.worker.stop()
    assert seen == linear_mod.packing_works() and head.packed is None


def test_api_key_queue_limit_and_disconnect(run):
    """A second server: a key, a queue of one, the full cap. A wrong key is a 401; a second
    request while a long stream runs is a 429; closing the stream stops its generation."""
    app = create_app(run, Settings(model_id="tiny", api_key="sekret", max_queue=1))
    with running(app) as u:
        for key in ("wrong", None):
            status, body = post(u, b'{"model": "tiny", "prompt": "a"}',
                                {"Authorization": f"Bearer {key}"} if key else {})
            assert status == 401 and body["error"]["code"] == "invalid_api_key"
        status, _ = post(u, b'{"text": "To be"}', path="api/walkthrough")
        assert status == 401  # the page's endpoints too
        c = openai.OpenAI(base_url=u + "v1", api_key="sekret", max_retries=0, timeout=30)
        stream = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=1024, stream=True)
        next(iter(stream))
        with pytest.raises(openai.RateLimitError):
            c.completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
        stream.close()
        deadline = time.monotonic() + 10
        while app.state.worker.outstanding and time.monotonic() < deadline:
            time.sleep(0.02)
        assert app.state.worker.outstanding == 0  # stopped long before 1024 tokens
        assert len(c.completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
                   .choices[0].text) == 2


def test_a_stream_writes_once_a_step_for_all_its_choices():
    """All choices' chunks of one step go out in one write: after a client hangs up, the next
    write fails and ends the stream. One write per choice kept writing to the lost socket
    (asyncio logged "socket.send() raised exception." for each) until the step was done."""
    from minitransformer.serve import app as app_mod
    from minitransformer.serve.completions import Plan

    def piece(i: int, text: str) -> dict:
        return {"index": i, "text": text, "finish_reason": None, "logprobs": None}

    class Steps:  # a worker whose job made two steps of three choices
        async def events(self, job):
            yield "pieces", [piece(0, "a"), piece(1, ""), piece(2, "c")]
            yield "pieces", [piece(0, "d"), piece(1, "e"), piece(2, "f")]
            yield "result", {}

    plan = Plan(["p"], [[1]], 2, 1.0, 0, 1.0, 3, [], None, None)

    async def writes():
        return [w async for w in app_mod._sse(Steps(), None, "tiny", plan)]

    out = asyncio.run(writes())
    assert len(out) == 3 and out[2] == "data: [DONE]\n\n"
    texts = [[c["choices"][0]["text"] for c in map(json.loads, w.split("data: ")[1:])]
             for w in out[:2]]
    assert texts == [["a", "c"], ["d", "e", "f"]]  # an empty piece is no chunk


def test_inspect_sees_a_position_through_the_window_that_ends_there(url, run):
    """Early in an 80-token text taken as a prompt (block_size 32, shift 8): position 40 was
    never predicted from, so it is seen as if the text had grown from its first token: the
    window moved at 33 tokens to start at 33 - 24 = 9, the model on tokens 9 .. 40."""
    text = TINY_TEXT[:80]
    status, body = post(url, json.dumps({"text": text, "position": 40, "top": 5}).encode(),
                        path="api/inspect")
    assert status == 200 and body["offset"] == 40 - 31 and len(body["tokens"]) == 32
    ids = torch.tensor([run.tokenizer.encode(text)[9:41]])
    with torch.no_grad():
        logits, _, internals = run.model(ids, return_internals=True)
    probs = torch.softmax(logits[0, -1], -1)
    torch.testing.assert_close(torch.tensor([t["prob"] for t in body["top"]]),
                               torch.topk(probs, 5).values)
    torch.testing.assert_close(torch.tensor(body["attention"][1]),
                               internals.attentions[1][0, :, -1, :])


def test_the_walkthrough_endpoint_and_its_page(url, run):
    """/api/walkthrough (in /openapi.json) keeps a walkthrough and gives its page's URL; the
    page links the walkthrough's own assets and the packaged CJK font's face; too long a text
    and an unknown ID are errors."""
    with urllib.request.urlopen(url + "openapi.json", timeout=10) as r:
        assert "/api/walkthrough" in json.loads(r.read())["paths"]
    status, body = post(url, json.dumps({"text": PROMPT, "lang": "zh"}).encode(),
                        path="api/walkthrough")
    assert status == 200 and body["steps"] == 8
    assert "".join(body["tokens"]).replace("␣", " ") == PROMPT
    with urllib.request.urlopen(url + body["url"].lstrip("/"), timeout=10) as r:
        page = r.read().decode()
    assert '<html lang="zh-CN">' in page and '<script src="/assets/explain.js">' in page
    with urllib.request.urlopen(url + "assets/explain.js", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/javascript")
    assert '<link rel="stylesheet" href="/assets/fonts.css">' in page
    with urllib.request.urlopen(url + "assets/fonts.css", timeout=10) as r:
        assert 'src: url("/assets/cjk.otf")' in r.read().decode()
    with urllib.request.urlopen(url + "assets/cjk.otf", timeout=10) as r:
        assert r.headers["Content-Type"] == "font/otf" and r.read(4) == b"OTTO"  # OpenType
    status, body = post(url, json.dumps({"text": TINY_TEXT[:80]}).encode(),
                        path="api/walkthrough")
    assert status == 400 and "at most" in body["error"]["message"]
    assert_openai_error(body)
    # tail: the text's last tokens that fit the window (block_size 32 here), as the page asks
    status, body = post(url, json.dumps({"text": TINY_TEXT[:80], "tail": True}).encode(),
                        path="api/walkthrough")
    assert status == 200 and body["dropped"] == 48
    assert "".join(body["tokens"]).replace("␣", " ").replace("⏎", "\n") == TINY_TEXT[48:80]
    try:
        urllib.request.urlopen(url + "walkthrough/nope", timeout=10)
        raise AssertionError("an unknown walkthrough was served")
    except urllib.error.HTTPError as e:
        assert e.code == 404


def test_a_walkthrough_layer_or_head_out_of_range_names_its_field(url, run):
    """Past the model's layers or heads: a 400 naming ``layer`` (``head``), in the API's
    words (not the ``explain`` command's flags)."""
    cfg = run.model.config
    for field, n in (("layer", cfg.n_layer), ("head", cfg.n_head)):
        status, body = post(url, json.dumps({"text": PROMPT, field: n}).encode(),
                            path="api/walkthrough")
        assert status == 400 and body["error"]["param"] == field, body
        message = body["error"]["message"]
        assert "--" not in message and f"0 to {n - 1}" in message, message
        assert_openai_error(body)


def test_a_gpt_server_does_not_translate(url):
    status, body = post(url, b'{"text": "hola"}', path="api/translate")
    assert status == 400
    assert_openai_error(body)


def test_concurrent_unseeded_requests_are_decoded_as_one_batch(run):
    """Four greedy requests queue behind a long stream; when it is closed the worker takes
    them as one batch (two prompts of one length, two lengths of answer), each its own text."""
    app = create_app(run, Settings(model_id="tiny", max_batch=8))
    asks = [("To be", 8), ("0: To", 3), ("To be", 3), ("0: To", 8)]
    with running(app) as u:
        c = openai.OpenAI(base_url=u + "v1", api_key="unused", max_retries=0, timeout=30)
        stream = c.completions.create(model="tiny", prompt=PROMPT, max_tokens=1024, seed=0,
                                      stream=True)
        next(iter(stream))
        results = {}
        threads = [threading.Thread(target=lambda i, p, n: results.__setitem__(
            i, c.completions.create(model="tiny", prompt=p, max_tokens=n, temperature=0)),
            args=(i, p, n)) for i, (p, n) in enumerate(asks)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while app.state.worker.outstanding < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        stream.close()
        for t in threads:
            t.join(30)
    assert 4 in app.state.worker.batches
    for i, (p, n) in enumerate(asks):
        assert results[i].choices[0].text == reference(run, p, n, 0, temperature=0.0)
        assert results[i].usage.completion_tokens == n


def test_the_neutral_values_of_unsupported_options_are_accepted(url):
    body = {"model": "tiny", "prompt": "a", "max_tokens": 2, "seed": 1, "best_of": 1,
            "logit_bias": {}, "presence_penalty": 0, "frequency_penalty": 0.0, "echo": False,
            "user": "someone", "stream_options": None,
            "suffix": None}  # OpenAI's parameters, as LangChain's OpenAI and others send them
    got, answer = post(url, json.dumps(body).encode())
    assert got == 200, answer
    assert len(answer["choices"]) == 1


def test_fill_mask_answers_each_slot_and_refuses_a_text_without_one(tmp_path, url,
                                                                   make_encoder):
    """A masked-LM encoder's server: each [MASK]'s likeliest tokens with the probabilities
    the model's softmax gives them ([MASK] itself never offered); a text without a slot is a
    bad request and the server keeps serving; a GPT's server fills nothing."""
    model, tokenizer = make_encoder("abcdefgh ", 16, scale=0.5, folder=tmp_path / "mlm")
    cfg = model.config
    with running(create_app(load_run(tmp_path / "mlm"), Settings(model_id="mlm"))) as mlm:
        status, body = post(mlm, b'{"text": "ab[MASK]d [MASK]", "top": 3}', path="api/fill-mask")
        assert status == 200
        ids = tokenizer.encode("ab") + [cfg.mask_id] + tokenizer.encode("d ") + [cfg.mask_id]
        with torch.no_grad():
            logits = model.eval()(torch.tensor([ids]))[0][0]  # (T, V)
        probs = logits.softmax(-1)
        probs[:, cfg.mask_id] = 0.0  # the model's own probabilities; [MASK] never offered
        assert [s["position"] for s in body["slots"]] == [2, 5]
        for slot in body["slots"]:
            want = probs[slot["position"]].topk(3)
            assert [p["id"] for p in slot["predictions"]] == want.indices.tolist()
            assert [p["prob"] for p in slot["predictions"]] == pytest.approx(want.values.tolist())
        assert body["texts"] == ["a", "b", "[MASK]", "d", " ", "[MASK]"] and body["ids"] == ids
        status, body = post(mlm, b'{"text": "abc"}', path="api/fill-mask")
        assert status == 400 and body["error"]["code"] == "no_mask"
        assert_openai_error(body)
        assert post(mlm, b'{"text": "[MASK]"}', path="api/fill-mask")[0] == 200
    status, body = post(url, b'{"text": "a[MASK]"}', path="api/fill-mask")  # the GPT's server
    assert status == 400 and body["error"]["code"] == "not_applicable"


@pytest.fixture
def seq2seq_folder(tmp_path):
    """An untrained encoder-decoder run folder (a joint BPE fitted on a few sentences)."""
    from minitransformer.config import Seq2SeqConfig
    from minitransformer.models import Seq2SeqTransformer
    from minitransformer.tokenizers import BPETokenizer

    tokenizer = BPETokenizer.train(["In the beginning.", "En el principio."] * 4, 280)
    cfg = Seq2SeqConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2,
                        n_embd=16, d_ff=32, dropout=0.0)
    meta = {"format": "minitransformer", "version": 1, "family": "seq2seq",
            "model": dataclasses.asdict(cfg), "data": {"source": "test"}}
    write_model_files(tmp_path / "mt", Seq2SeqTransformer(cfg), meta, tokenizer)
    return tmp_path / "mt"


def test_a_translation_that_ends_at_once_is_an_empty_translation(seq2seq_folder):
    """A model whose first choice is </s> translates to nothing: a 200 with an empty
    translation, as ``translate`` prints an empty line (no cross-attention to draw)."""
    from minitransformer.training.checkpoint import read_meta

    run = load_run(seq2seq_folder)
    model, tokenizer = run.model, run.tokenizer
    with torch.no_grad():  # every decoder output is u, and only </s>'s embedding is along u
        u = torch.nn.functional.normalize(torch.ones(model.config.n_embd), dim=0)
        model.tok_emb.weight[tokenizer.eos_id] = 100 * u
        norm = model.decoder.layers[-1].res_ffn.norm
        norm.weight.zero_()
        norm.bias.copy_(u)
    write_model_files(seq2seq_folder, model, read_meta(seq2seq_folder), tokenizer)
    assert main(["translate", str(seq2seq_folder), "In the"]) == 0
    with running(create_app(load_run(seq2seq_folder), Settings(model_id="m"))) as u:
        for beam in (1, 4):
            status, body = post(u, json.dumps({"text": "In the", "beam": beam}).encode(),
                                path="api/translate")
            assert (status, body) == (200, {"translation": ""}), body


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_a_source_past_the_block_size_is_translated_as_the_command_line_does(tmp_path, capsys,
                                                                            pos):
    """translate reads the first block_size - 1 tokens of a longer source where its positions
    are learned and says so, the whole source where they go on; the server translates it the
    same and says so, without the alignment (drawn within block_size)."""
    from minitransformer.config import Seq2SeqConfig
    from minitransformer.models import Seq2SeqTransformer
    from minitransformer.tokenizers import BPETokenizer

    tokenizer = BPETokenizer.train(["In the beginning.", "En el principio."] * 4, 280)
    cfg = Seq2SeqConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2,
                        n_embd=16, d_ff=32, dropout=0.0, pos_encoding=pos)
    meta = {"format": "minitransformer", "version": 1, "family": "seq2seq",
            "model": dataclasses.asdict(cfg), "data": {"source": "test"}}
    write_model_files(tmp_path / "mt", Seq2SeqTransformer(cfg), meta, tokenizer)
    long = "In the beginning. " * 8
    n = len(tokenizer.encode(long))
    assert main(["translate", str(tmp_path / "mt"), "In the", long, "--beam", "1"]) == 0
    printed = capsys.readouterr()
    assert printed.err == ("" if pos == "sinusoidal" else
                           f"note: sentence 2 is {n} tokens; it is translated from its first "
                           f"15 (the model's learned positions end there)\n")
    with running(create_app(load_run(tmp_path / "mt"), Settings(model_id="m"))) as u:
        status, body = post(u, json.dumps({"text": long, "beam": 1}).encode(),
                            path="api/translate")
        assert status == 200 and body["translation"] == printed.out.splitlines()[1], body
        assert f"{n} tokens" in body["note"] and "cross_attention" not in body
        assert ("first 15" in body["note"]) == (pos == "learned")
        assert "cross_attention" in post(u, b'{"text": "In the"}', path="api/translate")[1]


def test_a_translation_past_the_block_size_is_aligned_from_its_beginning(seq2seq_folder,
                                                                         monkeypatch):
    """A short source whose translation outgrows block_size (sinusoidal positions go on):
    the alignment of the translation's first block_size - 1 tokens, and a note saying so."""
    from minitransformer.serve import probes

    run = load_run(seq2seq_folder)  # block_size 16
    long = "En el principio. " * 6
    monkeypatch.setattr(type(run.family), "translate", lambda *a: [long])
    body = probes.translate(run, "In the", 1)
    n = len(run.tokenizer.encode(long))
    assert body["translation"] == long and n > 15
    assert body["note"] == (f"the translation is {n} tokens; its alignment is drawn for the "
                            f"first 15 (the model's block_size)")
    assert len(body["cross_attention"]["target"]) == 16  # <s> and 15 tokens


def test_runs_that_do_not_continue_text_say_what_they_answer(seq2seq_folder, tmp_path,
                                                             make_encoder):
    """A chat or a completion request to an encoder-decoder's or a masked-LM encoder's server
    names what does work for that run (its translate or fill-mask endpoint, the playground),
    never the other /v1 endpoint that refuses it too; the endpoint named answers."""
    make_encoder("abc [MASK]", folder=tmp_path / "mlm")
    asks = (("v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            ("v1/completions", {"prompt": "hi"}))
    for folder, works, body in ((seq2seq_folder, "POST /api/translate", {"text": "In the"}),
                                (tmp_path / "mlm", "POST /api/fill-mask", {"text": "a[MASK]"})):
        with running(create_app(load_run(folder), Settings(model_id="m"))) as u:
            for path, ask in asks:
                status, answer = post(u, json.dumps({"model": "m", **ask}).encode(), path=path)
                message = answer["error"]["message"]
                assert status == 400 and works in message and "the playground" in message
                assert "/v1/" not in message, message
            assert post(u, json.dumps(body).encode(), path=works.split()[1][1:])[0] == 200
