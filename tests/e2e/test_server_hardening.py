"""End-to-end tests of the server's defences (issue 11), each against a real `moefold serve`.

Request JSON: nesting-depth limit, integer ranges, n x prompts over the queue, clipped echoes.
HTTP layer: API key, header count / size limits, slow clients (a receive deadline, and handler
threads that never wait for a request's bytes), pipelining, duplicate Content-Length, CORS, Host
allow-list. Serving: request log lines, generation_config.json defaults, `created` = arrival.
After every bad request the server must still answer a normal request correctly.
"""

import concurrent.futures as cf
import json
import os
import shutil
import socket
import threading
import time

import pytest
import requests

NORMAL = {"prompt": "hello there", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
MSGS = [{"role": "user", "content": "hi"}]
DEPTH = 30000  # about 60 KB of brackets: enough to overflow a handler thread's stack recursively


def assert_normal_request_works(srv, headers=None):
    r = srv.http.post(srv.url + "/v1/completions", json=NORMAL, headers=headers or {}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


def assert_openai_error(r, status, param=None, code=None):
    assert r.status_code == status, f"{r.status_code} {r.text[:300]}"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def raw_exchange(port, data: bytes, timeout=10.0) -> bytes:
    """Sends `data` on a fresh connection and returns everything the server sends until it closes
    the connection (the last request should say `Connection: close`) or `timeout` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            out += chunk
        return out


def nested(depth):
    return "[" * depth + "1" + "]" * depth


# --- request JSON -----------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["message", "tools", "chat_template_kwargs", "prompt"])
def test_deeply_nested_json_is_400_and_the_server_survives(server, where):
    deep = nested(DEPTH)
    if where == "message":
        body = '{"messages": [{"role": "user", "content": "hi", "name": %s}]}' % deep
    elif where == "tools":
        body = '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": %s}]}' % deep
    elif where == "chat_template_kwargs":
        body = '{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": %s}}' % deep
    else:
        body = '{"prompt": %s}' % deep
    path = "/v1/completions" if where == "prompt" else "/v1/chat/completions"
    r = server.http.post(server.url + path, data=body, headers={"Content-Type": "application/json"}, timeout=60)
    err = assert_openai_error(r, 400, code="json_too_deep")
    assert "64" in err["message"]
    assert_normal_request_works(server)


@pytest.mark.parametrize("field,value", [
    ("seed", 2**63), ("seed", 2**64 - 1), ("seed", 2**64), ("top_k", 2**63), ("top_k", 2**32),
    ("max_tokens", 2**64 - 1), ("n", 2**63 + 1), ("logprobs", 2**64 - 1), ("max_tokens", 2.5),
])
def test_out_of_range_and_fractional_integers_are_400(server, field, value):
    r = server.post("/v1/completions", {"prompt": "x", field: value})
    err = assert_openai_error(r, 400, param=field)
    assert "got -" not in err["message"], err  # the value the client sent, never a wrapped one
    assert_normal_request_works(server)


def test_chat_top_logprobs_beyond_64_bits_is_400(server):
    r = server.post("/v1/chat/completions", {"messages": MSGS, "logprobs": True, "top_logprobs": 2**64 + 5})
    assert_openai_error(r, 400, param="top_logprobs")
    assert_normal_request_works(server)


def test_more_sequences_than_the_queue_holds_is_400_not_503(model, start_server):
    srv = start_server(model[0], "--max-queue", 4)
    r = srv.post("/v1/completions", {"prompt": ["a", "b"], "n": 3, "max_tokens": 2})
    assert_openai_error(r, 400, param="n", code="too_many_sequences")
    assert "Retry-After" not in r.headers
    ok = srv.post("/v1/completions", {"prompt": ["a", "b"], "n": 2, "max_tokens": 2})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 4


def test_error_messages_clip_the_values_they_echo(server):
    r = server.post("/v1/completions", {"prompt": "x", "model": "m" * (10 << 20)})
    err = assert_openai_error(r, 400, param="model")
    assert len(r.content) < 2000
    assert "m" * 100 + "..." in err["message"]
    assert_normal_request_works(server)


# --- API key ----------------------------------------------------------------------------------


def test_api_key_required_everywhere_but_health(model, start_server):
    srv = start_server(model[0], "--api-key", "s3cret")
    assert srv.http.get(srv.url + "/health", timeout=10).status_code == 200
    for method, path in [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions"),
                         ("POST", "/v1/chat/completions"), ("GET", "/nothing")]:
        for auth in [None, "Bearer wrong", "s3cret", "Bearer s3cret0"]:
            headers = {"Authorization": auth} if auth else {}
            r = srv.http.request(method, srv.url + path, json=NORMAL, headers=headers, timeout=10)
            err = assert_openai_error(r, 401, code="invalid_api_key")
            assert err["type"] == "authentication_error"
            assert r.headers.get("WWW-Authenticate") == "Bearer"
    good = {"Authorization": "Bearer s3cret"}
    assert srv.http.get(srv.url + "/v1/models", headers=good, timeout=10).status_code == 200
    assert srv.http.get(srv.url + "/metrics", headers=good, timeout=10).status_code == 200
    assert_normal_request_works(srv, headers=good)
    import openai
    client = srv.openai()
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_api_key_from_the_environment_and_open_metrics(model, start_server, monkeypatch):
    monkeypatch.setenv("MOEFOLD_API_KEY", "env-key")
    srv = start_server(model[0], "--disable-metrics-auth")
    monkeypatch.delenv("MOEFOLD_API_KEY")
    assert srv.http.get(srv.url + "/metrics", timeout=10).status_code == 200
    assert srv.http.get(srv.url + "/v1/models", timeout=10).status_code == 401
    assert srv.http.get(srv.url + "/v1/models", headers={"Authorization": "Bearer env-key"}, timeout=10).status_code == 200


# --- HTTP limits ------------------------------------------------------------------------------


def test_too_many_headers_get_431(server):
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(500)) + b"\r\n"
    out = raw_exchange(server.port, head)
    assert out.startswith(b"HTTP/1.1 431 "), out[:200]
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "headers_too_large"
    assert_normal_request_works(server)


def test_huge_headers_are_refused_not_buffered(server):
    # 29 MB of headers used to be read and kept; now the connection is answered 431 and closed
    # after 64 KB, so the client's send fails or it reads the 431.
    out = b""
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\n")
            line = b"X-Big: " + b"b" * 4000 + b"\r\n"
            for _ in range(29 * 1024 * 1024 // len(line)):
                s.sendall(line)
            out = s.recv(65536)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert out == b"" or out.startswith(b"HTTP/1.1 431 "), out[:200]
    assert_normal_request_works(server)


def test_json_body_sent_as_form_content_type_is_accepted(server):
    # `curl -d` labels a body application/x-www-form-urlencoded; cpp-httplib refused such bodies over
    # 8 KiB with a bare 413 although the server's body limit is 64 MiB.
    body = json.dumps(NORMAL) + " " * 20000  # a 20 KB body (JSON allows the trailing whitespace)
    r = server.http.post(server.url + "/v1/completions", data=body.encode(),
                         headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=120)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["usage"]["completion_tokens"] == 3


def test_two_content_lengths_are_400(server):
    body = json.dumps(NORMAL).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
           b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(body), len(body))) + body
    out = raw_exchange(server.port, req)
    assert out.startswith(b"HTTP/1.1 400 "), out[:200]
    assert b"Content-Length" in out
    assert_normal_request_works(server)


def test_pipelined_requests_are_all_answered(server):
    body = json.dumps(NORMAL).encode()
    def one(extra=b""):
        return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
                b"Content-Length: %d\r\n\r\n" % len(body)) + body

    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    out = raw_exchange(server.port, one() + one() + health + one(b"Connection: close\r\n"))
    assert out.count(b"HTTP/1.1 200 OK") == 4, out
    assert out.count(b'"finish_reason":"length"') == 3


def test_chunked_and_expect_continue_bodies(server):
    body = json.dumps(NORMAL).encode()
    r = server.http.post(server.url + "/v1/completions", headers={"Content-Type": "application/json"},
                         data=(body[i:i + 7] for i in range(0, len(body), 7)), timeout=60)  # chunked
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue")  # the body is awaited only now
        s.sendall(body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert b"HTTP/1.1 200 OK" in out and b'"completion_tokens":3' in out


def trickle(port, stop, started):
    """Opens a connection and sends a request's headers one byte every 0.2 s until told to stop."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
    except OSError:
        return
    started.append(s)
    data = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + b"X-Slow: " + b"s" * 500
    try:
        for b in data:
            if stop.is_set():
                break
            s.send(bytes([b]))
            time.sleep(0.2)
    except OSError:
        pass


def test_slow_clients_do_not_starve_normal_requests(model, start_server):
    # 150 trickling connections against 8 handler threads: before, each held a thread while it
    # trickled, so no normal request got through until they gave up.
    srv = start_server(model[0], "--http-threads", 8)
    stop, sockets = threading.Event(), []
    threads = [threading.Thread(target=trickle, args=(srv.port, stop, sockets), daemon=True) for _ in range(150)]
    try:
        for t in threads:
            t.start()
        deadline = time.time() + 10
        while len(sockets) < 150 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert len(sockets) == 150
        for _ in range(3):
            # A new connection each time (a kept-alive one would already have its thread).
            with requests.Session() as fresh:
                fresh.trust_env = False
                t0 = time.time()
                r = fresh.post(srv.url + "/v1/completions", json=NORMAL, timeout=10, headers={"Connection": "close"})
                assert r.status_code == 200
                assert time.time() - t0 < 5
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        for s in sockets:
            s.close()
    assert_normal_request_works(srv)


def test_a_request_not_received_within_the_deadline_gets_408(model, start_server):
    srv = start_server(model[0], "--http-receive-timeout", 1)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
        t0 = time.time()
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        assert 0.8 < time.time() - t0 < 5
    assert out.startswith(b"HTTP/1.1 408 "), out[:200]
    assert json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert_normal_request_works(srv)


# --- CORS and Host ----------------------------------------------------------------------------


def test_no_cors_headers_unless_origins_are_allowed(server):
    r = server.http.get(server.url + "/v1/models", headers={"Origin": "https://evil.example"}, timeout=10)
    assert r.status_code == 200
    assert not any(k.lower().startswith("access-control-") for k in r.headers)
    pre = server.http.options(server.url + "/v1/chat/completions", timeout=10,
                              headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 405
    assert not any(k.lower().startswith("access-control-") for k in pre.headers)
    assert_normal_request_works(server)


def test_cors_with_allowed_origins(model, start_server):
    srv = start_server(model[0], "--allowed-origins", "https://app.example", "--allowed-methods", "GET,POST")
    pre = srv.http.options(srv.url + "/v1/chat/completions", timeout=10,
                           headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                                    "Access-Control-Request-Headers": "content-type, authorization"})
    assert pre.status_code == 200
    assert pre.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert "content-type" in pre.headers["Access-Control-Allow-Headers"]
    bad = srv.http.options(srv.url + "/v1/chat/completions", timeout=10,
                           headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert bad.status_code == 400
    r = srv.http.post(srv.url + "/v1/completions", json=NORMAL, headers={"Origin": "https://app.example"}, timeout=60)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "https://app.example"
    r = srv.http.post(srv.url + "/v1/completions", json=NORMAL, headers={"Origin": "https://evil.example"}, timeout=60)
    assert r.status_code == 200 and "Access-Control-Allow-Origin" not in r.headers


def test_host_allow_list(model, start_server):
    srv = start_server(model[0], "--allowed-hosts", "127.0.0.1,localhost")
    r = srv.http.get(srv.url + "/v1/models", headers={"Host": "evil.example"}, timeout=10)
    assert_openai_error(r, 400, code="invalid_host")
    assert srv.http.get(srv.url + "/v1/models", timeout=10).status_code == 200
    assert_normal_request_works(srv)


# --- serving ----------------------------------------------------------------------------------


def server_log(srv) -> str:
    with open(srv.log.name) as f:
        return f.read()


def test_request_log_lines_and_loading_line(model, start_server):
    srv = start_server(model[0])
    assert "loading the model from" in server_log(srv) and "model loaded in" in server_log(srv)
    r = srv.post("/v1/completions", {"prompt": "hello", "max_tokens": 4, "ignore_eos": True})
    assert r.status_code == 200
    prompt_tokens = r.json()["usage"]["prompt_tokens"]
    srv.post("/v1/completions", {"prompt": "x", "top_p": 7})
    events = srv.http.post(srv.url + "/v1/chat/completions", timeout=60, stream=True,
                           json={"messages": MSGS, "max_tokens": 5, "ignore_eos": True, "stream": True})
    assert events.status_code == 200
    _ = events.content
    assert srv.http.get(srv.url + "/v1/x%0Afake%20line", timeout=10).status_code == 404
    time.sleep(0.3)
    lines = [line for line in server_log(srv).splitlines() if '"POST /v1/' in line]
    assert any(f'"POST /v1/completions" 200 prompt_tokens={prompt_tokens} completion_tokens=4 time=' in line
               for line in lines), lines
    assert any('"POST /v1/completions" 400 time=' in line for line in lines), lines
    assert any('"POST /v1/chat/completions" 200 prompt_tokens=' in line and "completion_tokens=5" in line
               for line in lines), lines
    log = server_log(srv)
    assert '"GET /v1/x\\x0afake line" 404' in log, log  # a decoded newline cannot forge a log line
    assert "\nfake line" not in log


def test_generation_config_defaults_and_overrides(model, start_server, tmp_path):
    d = tmp_path / "with-gencfg"
    shutil.copytree(model[0], d)
    (d / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_p": 0.9, "max_new_tokens": 7}))
    base = start_server(model[0], "--served-model-name", "m")
    cfg = start_server(d, "--served-model-name", "m")
    vllm = start_server(d, "--served-model-name", "m", "--generation-config", "vllm")
    assert "generation_config.json: temperature=0 top_p=0.9" in server_log(cfg)

    def text(srv, **kw):
        r = srv.post("/v1/completions", {"prompt": "defaults", "max_tokens": 12, "ignore_eos": True, **kw})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    greedy = text(base, temperature=0)
    # The file's temperature 0 is the default: no temperature in the request means greedy.
    assert text(cfg, seed=1) == greedy and text(cfg, seed=2) == greedy
    # A request's own value wins.
    assert text(cfg, temperature=1.0, top_p=1.0, seed=3) == text(base, temperature=1.0, seed=3)
    # --generation-config vllm ignores the file.
    assert text(vllm, seed=3) == text(base, seed=3)


def test_created_is_the_arrival_time(model, start_server):
    # One sequence at a time: requests sent together finish one after another, the last long
    # after it arrived. Its `created` must still be its arrival.
    srv = start_server(model[0], "--max-num-seqs", 1)
    body = {"prompt": "slow", "max_tokens": 1000, "ignore_eos": True, "temperature": 0}
    t0 = time.time()
    with cf.ThreadPoolExecutor(12) as ex:
        results = list(ex.map(lambda _: (srv.post("/v1/completions", body).json(), time.time()), range(12)))
    last_done = max(done for _, done in results)
    assert last_done - t0 > 2.0, "the requests should take a while for this test to mean anything"
    for r, done in results:
        assert int(t0) <= r["created"] <= int(t0) + 1, (t0, r["created"], done)


def test_serve_help_lists_cuda_and_the_defaults():
    import subprocess
    from conftest import binary

    out = subprocess.run([binary(), "serve", "--help"], capture_output=True, text=True, timeout=30).stdout
    device = next(line for line in out.splitlines() if "--device" in line)
    assert "cuda" in device and "=cpu" in device
    for flag, default in [("--port", "=8000"), ("--max-model-len", "=0"), ("--generation-config", "=auto"),
                          ("--http-receive-timeout", "=30"), ("--load-format", "=auto"), ("--seed", "=0")]:
        line = next(line for line in out.splitlines() if line.strip().startswith(flag + " "))
        assert default in line, line
