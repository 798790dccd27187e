"""Drives `abhyasa mcp` with the Python MCP SDK (the `mcp` package, 2.x), over stdio and over
streamable HTTP.

Usage: python client.py ABHYASA_BINARY WORKDIR [CERTS PERMIT_STDIO PERMIT_HTTP]

Builds certificates and a node config in WORKDIR, spawns the server over each transport in
turn (`--stdio`, then `--http 127.0.0.1:<port>`, each with its own state) and checks,
each with an independent expectation: the tools are listed; two obligations riding a call
come back as two acks; a consent revocation riding a call of the tool that uses that scope
refuses that very call and every later one, naming the obligation; a revoked token refuses
the tool that presents it; a malformed envelope is JSON-RPC -32602 and nothing in it is
applied; a re-sent obligation is acked again and not applied twice. With a certificates
directory and two dispatch permits (base64 CBOR, made by the Rust test from the principal's
ledger branch), the budget-gated tool `book` is refused without a permit, runs once with one
(its runs counted in a file the tool itself appends to), answers a replay with the same
receipt and no run, and refuses the permit for other arguments or a permit that is not one;
each receipt is printed (`receipt [via]: …`) for the Rust test to settle its branch with.
Exits non-zero on the first failure.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
import httpx2
from mcp.shared.exceptions import MCPError

OBLIGATIONS = "org.abhyasa/obligations"
ACKS = "org.abhyasa/acks"
PERMIT = "org.abhyasa/permit"
RECEIPT = "org.abhyasa/receipt"


def free_port(kind):
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def encode(binary, n, *spec):
    """One obligation as base64 CBOR, id n, from `principal` to `agent-1`."""
    out = subprocess.run(
        [binary, "encode", "--issuer", "principal", "--id", f"{n:032x}",
         "--target", "agent-1", "--deadline-ms", "60000", *spec],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip()


def text(result):
    return " ".join(c.text for c in result.content if getattr(c, "text", None) is not None)


def acks(result):
    meta = result.meta or {}
    return meta.get(ACKS, [])


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


async def main(binary, work, certs=None, permit_stdio=None, permit_http=None):
    await over_stdio(binary, os.path.join(work, "stdio"), certs, permit_stdio)
    await over_http(binary, os.path.join(work, "http"), certs, permit_http)
    print("mcp python client: all checks passed", flush=True)


def setup(binary, work, certs=None):
    """Certificates (made here unless given) and a node config in `work`; returns the
    config's path."""
    os.makedirs(work)
    if certs is None:
        certs = os.path.join(work, "certs")
        subprocess.run([binary, "certs", "init", "--dir", certs], check=True,
                       capture_output=True)
        subprocess.run([binary, "certs", "issue", "agent-1", "--dir", certs], check=True,
                       capture_output=True)
    runs = os.path.join(work, "book.runs")
    admin = os.path.join(work, "admin.sock")
    config = os.path.join(work, "agent-1.toml")
    with open(config, "w") as f:
        f.write(f"""
agent = "agent-1"
listen = "127.0.0.1:{free_port(socket.SOCK_DGRAM)}"
certs = "{certs}"
state = "{os.path.join(work, 'state')}"
admin = "{admin}"

[ledger]
gateway = true

[mcp]
principal = "principal"
# The node's own tools: granted here (the default is neither).
node_tools = ["issue", "ledger"]

[[mcp.tools]]
name = "book"
description = "Books a trip (appends its arguments to a file, one line per run)."
cost = "cents=25"
purpose = "travel"
command = ["sh", "-c", "cat >> {runs}; echo >> {runs}; echo booked"]

[[mcp.tools]]
name = "calendar_read"
description = "Reads the principal's calendar (echoes its arguments)."
scopes = ["calendar.read"]
command = ["cat"]

[[mcp.tools]]
name = "mail_send"
description = "Sends mail with the principal's token."
token = "tok-mail"
command = ["echo", "sent"]
""")
    return config, certs, admin


async def over_stdio(binary, work, certs, permit):
    config, certs, admin = setup(binary, work, certs)
    params = StdioServerParameters(command=binary, args=["mcp", "--config", config, "--stdio"])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await checks(session, binary, "stdio")
            await ledger_checks(session, binary, certs, admin, "stdio")
            if permit:
                await budget_checks(session, work, permit, "stdio")


async def over_http(binary, work, certs, permit):
    config, certs, admin = setup(binary, work, certs)
    port = free_port(socket.SOCK_STREAM)
    server = subprocess.Popen([binary, "mcp", "--config", config, "--http", f"127.0.0.1:{port}"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        check(line.startswith("MCP on http://"), f"the HTTP server says where: {line.strip()}")
        url = f"http://127.0.0.1:{port}/mcp"
        token_file = os.path.join(work, "state", "mcp.token")
        with open(token_file) as f:
            token = f.read().strip()
        check(os.stat(token_file).st_mode & 0o777 == 0o600, "the bearer token file is mode 0600")
        initialize = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}})
        plain = {"Content-Type": "application/json",
                 "Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient() as raw:
            r = await raw.post(url, content=initialize, headers=plain)
            check(r.status_code == 401, f"a request without the bearer token is 401 ({r.status_code})")
            r = await raw.post(url, content=initialize,
                               headers={**plain, "Authorization": f"Bearer {token}",
                                        "Origin": "http://attacker.example"})
            check(r.status_code == 403, f"a browser's request (Origin) is 403 ({r.status_code})")
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, streamable_http_client(url, http_client=http) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await checks(session, binary, "http")
                await ledger_checks(session, binary, certs, admin, "http")
                if permit:
                    await budget_checks(session, work, permit, "http")
    finally:
        server.kill()
        server.wait()


async def checks(session, binary, via):
    def check_via(cond, what):
        check(cond, f"[{via}] {what}")

    await session.initialize()

    tools = {t.name for t in (await session.list_tools()).tools}
    for name in ["abhyasa_deliver", "abhyasa_custody_status", "abhyasa_issue",
                 "calendar_read", "mail_send", "book"]:
        check_via(name in tools, f"tool {name} is listed")

    r = await session.call_tool("calendar_read", {"day": "monday"})
    check_via(not r.is_error and json.loads(text(r)) == {"day": "monday"},
          "calendar_read runs while consent stands")

    token = encode(binary, 1, "--kind", "oauth.token", "--action", "revoke",
                   "--token", "tok-mail")
    files = encode(binary, 2, "--kind", "anumati.consent", "--decision", "revoke",
                   "--scope", "files.write")
    r = await session.call_tool("abhyasa_deliver", {}, meta={OBLIGATIONS: [token, files]})
    check_via(len(acks(r)) == 2, "two obligations on one call: two acks")

    ids = [f"{1:032x}", f"{2:032x}", f"{77:032x}"]
    r = await session.call_tool("abhyasa_custody_status", {"ids": ids})
    s = r.structured_content
    check_via(s[ids[0]] == "applied" and s[ids[1]] == "applied" and s[ids[2]] == "unknown",
          "custody status: both applied, an unknown id unknown")
    check_via(len(acks(r)) == 2, "custody status acks the applied ones")

    revoke_id = f"{3:032x}"
    revoke = encode(binary, 3, "--kind", "anumati.consent", "--decision", "revoke",
                    "--scope", "calendar.read")
    r = await session.call_tool("calendar_read", {}, meta={OBLIGATIONS: [revoke]})
    check_via(r.is_error and "calendar.read" in text(r) and revoke_id in text(r),
          "a revocation riding the call refuses that very call, naming it")
    check_via(len(acks(r)) == 1, "the refused call still carries the ack")

    r = await session.call_tool("calendar_read", {})
    check_via(r.is_error and revoke_id in text(r), "and every later call")

    r = await session.call_tool("mail_send", {})
    check_via(r.is_error and "tok-mail" in text(r) and f"{1:032x}" in text(r),
          "the revoked token refuses the tool that presents it")

    good = encode(binary, 4, "--kind", "anumati.consent", "--decision", "revoke",
                  "--scope", "contacts.read")
    try:
        await session.call_tool("abhyasa_deliver", {},
                                meta={OBLIGATIONS: [good, "not base64!"]})
        check_via(False, "a malformed envelope is refused")
    except MCPError as e:
        check_via(e.error.code == -32602 and OBLIGATIONS in e.error.message,
              f"a malformed envelope is -32602 naming the key ({e.error.message})")
    r = await session.call_tool("abhyasa_custody_status", {"ids": [f"{4:032x}"]})
    check_via(r.structured_content[f"{4:032x}"] == "unknown",
          "nothing in the malformed envelope was applied")

    grant = encode(binary, 5, "--kind", "anumati.consent", "--decision", "grant",
                   "--scope", "calendar.read")
    r = await session.call_tool("calendar_read", {"n": 1}, meta={OBLIGATIONS: [grant]})
    check_via(not r.is_error, "a later grant riding the call lets it run")
    r = await session.call_tool("abhyasa_deliver", {}, meta={OBLIGATIONS: [revoke]})
    check_via(len(acks(r)) == 1, "the old revocation re-sent is acked again")
    r = await session.call_tool("calendar_read", {"n": 2})
    check_via(not r.is_error, "and not applied twice: the grant stands")


async def ledger_checks(session, binary, certs, admin, via):
    """The node's own ledger through `abhyasa_ledger`: a root grant handed in with the CLI,
    a spend through this node as its own gateway settled at its maximum, an overdraw
    refused."""
    def check_via(cond, what):
        check(cond, f"[{via}] {what}")

    out = subprocess.run(
        [binary, "ledger", "grant", "--admin", admin, "--certs", certs, "--holder", "agent-1",
         "--root", "1", "--budget", "cents=100", "--label", "travel"],
        capture_output=True, text=True)
    check_via(out.returncode == 0, f"a root grant of 100 cents reaches the node ({out.stdout.strip()})")

    async def ledger(**req):
        return await session.call_tool("abhyasa_ledger", req)

    r = await ledger(ledger="spend", credit="1", gateway="agent-1", purpose="travel",
                     operation="python spend", max="cents=30", key="a1")
    check_via(not r.is_error, f"a spend of at most 30 cents is taken ({text(r)[:80]})")

    root = {}
    for _ in range(100):
        r = await ledger(ledger="status")
        roots = r.structured_content["ledger"]["roots"]
        root = roots[0] if roots else {}
        if root.get("committed") == "cents=30":
            break
        await asyncio.sleep(0.05)
    check_via(root.get("committed") == "cents=30" and root.get("available") == "cents=70"
              and root.get("quarantined") == "0",
              f"it settles through this node as gateway: 30 committed, 70 available ({root})")

    r = await ledger(ledger="spend", credit="1", gateway="agent-1", purpose="travel",
                     operation="too much", max="cents=80", key="a2")
    r2 = await ledger(ledger="status")
    after = r2.structured_content["ledger"]["roots"][0]
    check_via(r.is_error and after.get("available") == "cents=70",
              f"a spend above what is left is refused and changes nothing ({text(r)[:80]})")

    # A reclaimable delegation to a child that is lost (no node answers for it): in transit
    # until this node takes it back, without a word from the child.
    r = await ledger(ledger="delegate", credit="1", transfer="b1", amount="cents=20",
                     to="ghost", label=["travel"], reclaimable=True)
    r2 = await ledger(ledger="status")
    after = r2.structured_content["ledger"]["roots"][0]
    check_via(not r.is_error and after.get("available") == "cents=50"
              and after.get("in_transit") == "cents=20",
              f"a reclaimable delegation of 20 cents is in transit ({after})")
    r = await ledger(ledger="reclaim_transfer", transfer="b1")
    r2 = await ledger(ledger="status")
    st = r2.structured_content["ledger"]
    after = st["roots"][0]
    states = [t["state"] for t in st["transfers"]]
    check_via(not r.is_error and after.get("available") == "cents=70"
              and after.get("in_transit") == "0" and states == ["reclaimed"],
              f"reclaimed: the 20 cents are available again ({after}, {states})")


async def budget_checks(session, work, permit, via):
    def check_via(cond, what):
        check(cond, f"[{via}] {what}")

    runs_file = os.path.join(work, "book.runs")

    def runs():
        if not os.path.exists(runs_file):
            return 0
        with open(runs_file) as f:
            return sum(1 for line in f if "LHR" in line)

    trip = {"to": "LHR"}
    r = await session.call_tool("book", trip)
    check_via(r.is_error and "dispatch permit" in text(r) and runs() == 0,
              "a budget-gated tool refuses a call without a permit, and does not run")

    r = await session.call_tool("book", trip, meta={PERMIT: permit})
    receipt = (r.meta or {}).get(RECEIPT)
    check_via(not r.is_error and text(r).strip() == "booked", "with the permit it runs")
    check_via(runs() == 1, "exactly once")
    check_via(isinstance(receipt, str) and len(receipt) > 0, "and the receipt is on the result")
    print(f"receipt [{via}]: {receipt}", flush=True)

    r = await session.call_tool("book", trip, meta={PERMIT: permit})
    check_via(not r.is_error and (r.meta or {}).get(RECEIPT) == receipt,
              "a replayed permit gets the same receipt")
    check_via(runs() == 1 and "does not run again" in text(r), "and runs nothing")

    r = await session.call_tool("book", {"to": "CDG"}, meta={PERMIT: permit})
    check_via(r.is_error and "does not bind this call" in text(r),
              "the permit does not bind a call with other arguments")
    r = await session.call_tool("book", trip, meta={PERMIT: "AAEC"})
    check_via(r.is_error and PERMIT in text(r) and runs() == 1,
              "something that is not a permit is refused, naming the key")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
