"""An independent OAuth client library (Authlib, over httpx) against `abhyasa node` with
`[enforce]`: RFC 7662 introspection and RFC 7009 revocation, the node in front of an upstream
authorization server (a small one in this script, on the standard library's http.server).

Usage: introspect.py <abhyasa binary> <work dir>

Checks, each printed as `ok: ...`:
- the caller authenticates as OAuth clients do (client_secret_basic with the node's key), and
  without it, or with another secret, is refused 401;
- a token the node does not govern is answered by the upstream, in RFC 7662's shape, and the
  node presented the configured credentials there; one active past its own `exp` is inactive;
- an RFC 7009 revocation through Authlib is carried under custody to the holder: from then on
  the token is `{"active": false}` (no other member, as RFC 7662 §2.2 asks), the refusal names
  the obligation in a header, the upstream is no longer asked, and the holder applies it.
"""

import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
from authlib.integrations.httpx_client import OAuth2Client


def ok(what):
    print(f"ok: {what}", flush=True)


def free_port(kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


UPSTREAM_CREDENTIALS = "Basic bm9kZTp1cHN0cmVhbS1zZWNyZXQ="  # node:upstream-secret


class Upstream(http.server.BaseHTTPRequestHandler):
    """The real authorization server: tok-live is active for an hour, tok-old says active but
    expired, anything else is inactive. It records who asked, with which credentials."""

    asked = []

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length).decode()
        token = dict(p.split("=", 1) for p in body.split("&") if "=" in p).get("token")
        Upstream.asked.append((token, self.headers.get("authorization")))
        now = int(time.time())
        if token == "tok-live":
            answer = {"active": True, "exp": now + 3600, "client_id": "app-1",
                      "scope": "calendar.read", "token_type": "Bearer"}
        elif token == "tok-old":
            answer = {"active": True, "exp": now - 10}
        else:
            answer = {"active": False}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def rfc7662_shape(answer):
    """RFC 7662 §2.2: a JSON object with a boolean `active`; the optional members, where
    present, have their registered types."""
    assert isinstance(answer, dict), answer
    assert isinstance(answer.get("active"), bool), answer
    for name in ("scope", "client_id", "username", "token_type", "sub", "iss", "jti"):
        assert name not in answer or isinstance(answer[name], str), (name, answer)
    for name in ("exp", "iat", "nbf"):
        assert name not in answer or isinstance(answer[name], int), (name, answer)


def main():
    abhyasa, work = sys.argv[1], sys.argv[2]
    certs = os.path.join(work, "certs")
    run = lambda *a: subprocess.run([abhyasa, *a], check=True, capture_output=True)
    run("certs", "init", "--dir", certs)
    run("certs", "issue", "agent-1", "--dir", certs)
    run("certs", "issue", "principal", "--dir", certs)

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    credentials = os.path.join(work, "upstream.auth")
    fd = os.open(credentials, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, UPSTREAM_CREDENTIALS.encode())
    os.close(fd)

    agent_addr = f"127.0.0.1:{free_port(socket.SOCK_DGRAM)}"
    enforce = free_port()
    a_admin, p_admin = os.path.join(work, "a.sock"), os.path.join(work, "p.sock")
    p_state = os.path.join(work, "state-p")
    with open(os.path.join(work, "agent.toml"), "w") as f:
        f.write(f'agent = "agent-1"\nlisten = "{agent_addr}"\ncerts = "{certs}"\n'
                f'state = "{os.path.join(work, "state-a")}"\nadmin = "{a_admin}"\n')
    with open(os.path.join(work, "principal.toml"), "w") as f:
        f.write(f'agent = "principal"\nlisten = "127.0.0.1:{free_port(socket.SOCK_DGRAM)}"\n'
                f'certs = "{certs}"\nstate = "{p_state}"\nadmin = "{p_admin}"\n\n'
                f'[enforce]\nlisten = "127.0.0.1:{enforce}"\n\n'
                f'[enforce.upstream]\nurl = "http://127.0.0.1:{upstream.server_port}/introspect"\n'
                f'authorization_file = "{credentials}"\n\n'
                f'[[peers]]\nid = "agent-1"\naddr = "{agent_addr}"\n')
    nodes = [subprocess.Popen([abhyasa, "node", "--config", os.path.join(work, n)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for n in ("agent.toml", "principal.toml")]
    try:
        check(abhyasa, f"http://127.0.0.1:{enforce}", p_state, p_admin, a_admin)
    finally:
        for n in nodes:
            n.kill()
            n.wait()
        upstream.shutdown()
    print("oauth python client: all checks passed")


def check(abhyasa, base, p_state, p_admin, a_admin):
    key_file = os.path.join(p_state, "enforce.key")
    for _ in range(300):
        try:
            if os.path.exists(key_file):
                httpx.post(f"{base}/oauth2/introspect", timeout=1)
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    assert oct(os.stat(key_file).st_mode & 0o777) == "0o600"
    key = open(key_file).read().strip()
    ok("the node wrote its enforcement key 0600")

    introspect, revoke = f"{base}/oauth2/introspect", f"{base}/oauth2/revoke"
    client = OAuth2Client(client_id="resource-server", client_secret=key)

    r = httpx.post(introspect, data={"token": "tok-live"})
    assert r.status_code == 401, r.status_code
    other = OAuth2Client(client_id="resource-server", client_secret="not-the-key-" * 3)
    assert other.introspect_token(introspect, token="tok-live").status_code == 401
    ok("without the key, or with another secret, the caller is refused 401")

    r = client.introspect_token(introspect, token="tok-live", token_type_hint="access_token")
    assert r.status_code == 200, r.status_code
    live = r.json()
    rfc7662_shape(live)
    assert live["active"] is True and live["client_id"] == "app-1", live
    assert "abhyasa-obligation" not in r.headers
    assert Upstream.asked[-1] == ("tok-live", UPSTREAM_CREDENTIALS), Upstream.asked
    ok("an ungoverned token is answered by the upstream, asked with the configured credentials")

    r = client.introspect_token(introspect, token="tok-old")
    assert r.json() == {"active": False}, r.json()
    ok("an upstream 'active' past the token's own exp is inactive")

    r = client.revoke_token(revoke, token="tok-live", token_type_hint="access_token")
    assert r.status_code == 200, (r.status_code, r.text)
    obligation = r.headers["abhyasa-obligation"]
    assert re.fullmatch(r"[0-9a-f]{32}", obligation), obligation
    ok(f"RFC 7009 revocation through Authlib admitted under custody (obligation {obligation})")

    asked = len(Upstream.asked)
    r = client.introspect_token(introspect, token="tok-live")
    assert r.status_code == 200
    assert r.json() == {"active": False}, r.json()
    rfc7662_shape(r.json())
    assert r.headers["abhyasa-obligation"] == obligation, dict(r.headers)
    assert r.headers.get("cache-control") == "no-store"
    assert len(Upstream.asked) == asked, "the upstream was asked about a revoked token"
    ok("the revoked token is {\"active\": false} at once, naming the obligation; upstream not asked")

    for _ in range(200):
        status = json.loads(subprocess.run([abhyasa, "status", "--admin", p_admin, "--json"],
                                           capture_output=True).stdout)
        done = [o for o in status["recent"] if o["id"] == obligation]
        if done:
            break
        time.sleep(0.1)
    assert done and done[0]["outcome"] == "Applied", done
    agent = json.loads(subprocess.run([abhyasa, "status", "--admin", a_admin, "--json"],
                                      capture_output=True).stdout)
    assert "tok-live" in agent["honours"]["dropped_tokens"], agent["honours"]
    r = client.introspect_token(introspect, token="tok-live")
    assert r.json() == {"active": False} and r.headers["abhyasa-obligation-state"] == "applied"
    ok("the holder applied the revocation; the token stays inactive")

    r = client.introspect_token(introspect, token="tok-unknown")
    assert r.json() == {"active": False}
    r = httpx.post(introspect, data={"token_type_hint": "access_token"},
                   auth=("resource-server", key))
    assert r.status_code == 400 and r.json()["error"] == "invalid_request", r.text
    ok("an unknown token is inactive; a request without a token is invalid_request")


if __name__ == "__main__":
    main()
