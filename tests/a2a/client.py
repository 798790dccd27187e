"""The official A2A Python SDK (a2a-sdk) and raw HTTP against `abhyasa node` with `[a2a]`.

Usage: client.py <abhyasa binary> <work dir>

Sets up a CA and two certificates with the CLI, starts an agent node serving the A2A binding,
then: reads its card with the SDK's own resolver and parser (over mutual TLS), checks the
Abhyasa extension and that every profile's retry budget spans its deadline (the rule of
BINDINGS.md, computed here), POSTs an obligation in the reference implementation's JSON shape
with raw HTTP and checks the CustodyAck, POSTs it again (recognized, not applied twice), sends
bad input (refused, nothing applied), and reads the agent's own status. Prints `ok: ...` per
check.
"""

import asyncio
import datetime
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time

import httpx
from a2a.client.card_resolver import A2ACardResolver
from google.protobuf.json_format import MessageToDict

URI = "https://ravikiran438.github.io/abhyasa-protocol/v1"


def ok(what):
    print(f"ok: {what}", flush=True)


def free_port(kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def retries_needed(deadline, base, cap):
    covered, ceiling, n = 0.0, base, 0
    while covered < deadline:
        n += 1
        covered += min(cap, ceiling)
        ceiling *= 2
    return n


def main():
    abhyasa, work = sys.argv[1], sys.argv[2]
    certs = os.path.join(work, "certs")
    run = lambda *a: subprocess.run([abhyasa, *a], check=True, capture_output=True)
    run("certs", "init", "--dir", certs)
    run("certs", "issue", "agent-1", "--dir", certs)
    run("certs", "issue", "principal", "--dir", certs)
    https, admin = free_port(), os.path.join(work, "admin.sock")
    config = os.path.join(work, "agent.toml")
    with open(config, "w") as f:
        f.write(
            f'agent = "agent-1"\nlisten = "127.0.0.1:{free_port(socket.SOCK_DGRAM)}"\n'
            f'certs = "{certs}"\nstate = "{os.path.join(work, "state")}"\n'
            f'admin = "{admin}"\n\n[a2a]\nlisten = "127.0.0.1:{https}"\n'
        )
    node = subprocess.Popen([abhyasa, "node", "--config", config],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        check(abhyasa, certs, https, admin)
    finally:
        node.kill()
        node.wait()
    print("a2a python client: all checks passed")


def context(certs):
    ctx = ssl.create_default_context(cafile=os.path.join(certs, "ca.pem"))
    # The certificate names the agent ("agent-1"), not 127.0.0.1: the chain is verified
    # against the deployment CA, the name is checked below from the card.
    ctx.check_hostname = False
    ctx.load_cert_chain(os.path.join(certs, "principal.pem"), os.path.join(certs, "principal.key"))
    return ctx


def check(abhyasa, certs, https, admin):
    ctx = context(certs)
    base = f"https://127.0.0.1:{https}"

    async def card():
        async with httpx.AsyncClient(verify=ctx) as client:
            for _ in range(100):
                try:
                    return await A2ACardResolver(client, base).get_agent_card()
                except Exception:
                    await asyncio.sleep(0.1)
            return await A2ACardResolver(client, base).get_agent_card()

    c = asyncio.run(card())
    assert c.name == "agent-1", c.name
    ok("the SDK's resolver fetched and parsed the card over mutual TLS")
    assert c.supported_interfaces and c.supported_interfaces[0].url.startswith("https://agent-1:")
    ok("the card names the agent's HTTPS interface")
    ours = [e for e in c.capabilities.extensions if e.uri == URI]
    assert len(ours) == 1, [e.uri for e in c.capabilities.extensions]
    ok("one Abhyasa extension in capabilities.extensions")
    params = MessageToDict(ours[0].params)
    kinds = {k["kind"]: k for k in params["supported_kinds"]}
    assert set(kinds) == {"anumati.consent", "phala.belief_update", "oauth.token"}, kinds
    for k in kinds.values():
        need = retries_needed(k["deadline_seconds"], k.get("backoff_base_seconds", 1.0),
                              k["backoff_cap_seconds"])
        assert k["backoff"] == "exponential" and k["max_retries"] >= need, (k, need)
    ok("every profile's retry budget spans its deadline")
    assert params["custody_ack_endpoint"].endswith("/abhyasa/v1/custody-ack")
    ok("the custody-ack endpoint is on the card")

    def post(path, body, ctype="application/json"):
        conn = http.client.HTTPSConnection("127.0.0.1", https, context=ctx, timeout=10)
        conn.request("POST", path, body=body, headers={"content-type": ctype})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    endpoint = kinds["anumati.consent"]["obligation_endpoint"]
    path = endpoint[endpoint.index("/abhyasa/"):]
    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    obligation = {
        "obligation_id": "py-revoke-calendar",
        "kind": "anumati.consent",
        "target": "agent-1",
        "payload": {"decision": "revoke", "scope": "calendar.read"},
        "deadline_seconds": 3600,
        "max_retries": 15,
        "created_at": now,
        "sequence": None,
    }
    for attempt in ("first", "repeated"):
        status, data = post(path, json.dumps(obligation))
        assert status == 200, (status, data)
        ack = json.loads(data)
        assert ack["obligation_id"] == "py-revoke-calendar" and ack["target"] == "agent-1", ack
        assert ack["status"] == "applied", ack
        datetime.datetime.fromisoformat(ack["acked_at"].replace("Z", "+00:00"))
        ok(f"{attempt} raw-HTTP JSON obligation: 200 and an applied CustodyAck")

    bad = dict(obligation, obligation_id="py-bad", deadline_seconds=0)
    status, data = post(path, json.dumps(bad))
    assert status == 400 and "deadline_seconds" in json.loads(data)["error"], (status, data)
    ok("a zero deadline is refused with 400 naming the field")
    status, data = post(path, b"{not json")
    assert status == 400, (status, data)
    ok("malformed JSON is refused with 400")
    status, _ = post(path, json.dumps(obligation), "text/plain")
    assert status == 415, status
    ok("an unknown content type is refused with 415")
    forged = {"obligation_id": "x", "target": "agent-1", "status": "applied",
              "acked_at": now}
    status, _ = post("/abhyasa/v1/custody-ack", json.dumps(forged))
    assert status == 403, status
    ok("an ack in another agent's name is refused with 403")

    out = subprocess.run([abhyasa, "status", "--admin", admin, "--json"],
                         check=True, capture_output=True)
    s = json.loads(out.stdout)
    assert s["honours"]["withheld"] == [["principal", "calendar.read"]], s["honours"]
    ok("the agent withholds calendar.read for the principal that signed in")
    applied = [a for a in s["applied"] if a["says"].startswith("anumati.consent revoke")]
    assert len(applied) == 1, s["applied"]
    ok("applied once, though posted twice")

    # The SDK's own client, built from our card, sends an A2A message whose data part is an
    # obligation (the card's HTTP+JSON interface: POST /message:send); the ack is a data part
    # of the reply.
    replies = asyncio.run(send_with_sdk(c, base, ctx, dict(
        obligation, obligation_id="py-msg-revoke-contacts",
        payload={"decision": "revoke", "scope": "contacts.read"})))
    assert len(replies) == 1 and replies[0].HasField("message"), replies
    parts = replies[0].message.parts
    assert len(parts) == 1, parts
    ack = MessageToDict(parts[0])["data"]
    assert ack["obligation_id"] == "py-msg-revoke-contacts" and ack["status"] == "applied", ack
    ok("the SDK client's message:send carried an obligation; the reply's data part acks it applied")
    out = subprocess.run([abhyasa, "status", "--admin", admin, "--json"],
                         check=True, capture_output=True)
    withheld = json.loads(out.stdout)["honours"]["withheld"]
    assert ["principal", "contacts.read"] in withheld, withheld
    ok("the agent withholds contacts.read: applied, not only acked")


async def send_with_sdk(card, base, ctx, obligation):
    from a2a.client import ClientConfig, ClientFactory
    from a2a.types import Message, Part, Role, SendMessageRequest
    from google.protobuf import json_format, struct_pb2

    # The card names the agent (https://agent-1:PORT); on this machine it is on loopback.
    card.supported_interfaces[0].url = base
    async with httpx.AsyncClient(verify=ctx) as http:
        config = ClientConfig(httpx_client=http, streaming=False,
                              supported_protocol_bindings=["HTTP+JSON"])
        client = ClientFactory(config).create(card)
        data = struct_pb2.Value()
        json_format.ParseDict(obligation, data)
        message = Message(message_id="py-msg-1", role=Role.ROLE_USER, parts=[Part(data=data)])
        return [r async for r in client.send_message(SendMessageRequest(message=message))]


if __name__ == "__main__":
    main()
