"""A caller in another language spends its own budget at a gateway: with the official Python
MCP SDK it asks its own node (`abhyasa mcp --stdio`, tool `abhyasa_ledger`) to split, join,
reserve and release, then for a dispatch permit for one call of the gateway's priced tool
`book`; it calls `book` at the gateway (another `abhyasa mcp --stdio`) with the permit in
`_meta`, takes the receipt off the result and hands it back to its node, which settles what
the tool said it actually charged (20 of its 50 cents) and returns the rest.

argv: <abhyasa binary> <work dir> <payer config> <gateway config> <payer admin socket>
      <certs dir>
"""
import asyncio
import json
import subprocess
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

PERMIT = "org.abhyasa/permit"
RECEIPT = "org.abhyasa/receipt"
CHARGE = "org.abhyasa/charge"

binary, work, payer_cfg, gateway_cfg, payer_admin, certs = sys.argv[1:7]


def check(ok, what):
    if not ok:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def structured(r):
    assert not r.is_error, r.content
    return r.structured_content


async def ledger(session, **args):
    r = await session.call_tool("abhyasa_ledger", args)
    return structured(r)


async def main():
    payer = StdioServerParameters(command=binary, args=["mcp", "--config", payer_cfg, "--stdio"])
    gateway = StdioServerParameters(command=binary, args=["mcp", "--config", gateway_cfg, "--stdio"])
    async with stdio_client(payer) as (pr, pw), ClientSession(pr, pw) as mine:
        await mine.initialize()
        # The root grant, signed by the issuer, handed to the payer's node by its operator.
        subprocess.run(
            [binary, "ledger", "grant", "--admin", payer_admin, "--certs", certs,
             "--holder", "principal", "--root", "1", "--budget", "cents=1000",
             "--label", "travel"],
            check=True, capture_output=True)
        s = await ledger(mine, ledger="split", parent="1", child="2", amount="cents=300",
                         label=["travel"])
        check(s["ok"], "split 300 of the root credit into credit 2")
        s = await ledger(mine, ledger="join", inputs=["1", "2"], output="3")
        check(s["ok"], "joined credits 1 and 2 back into credit 3")
        s = await ledger(mine, ledger="reserve", credit="3", gateway="agent-1",
                         purpose="travel", operation="a hotel, maybe", max="cents=40", key="a1")
        status = (await ledger(mine, ledger="status"))["ledger"]
        check(status["roots"][0]["reserved"] == "cents=40", "reserved 40 without sending it")
        s = await ledger(mine, ledger="release_unsent", key="a1")
        status = (await ledger(mine, ledger="status"))["ledger"]
        check(status["roots"][0]["reserved"] == "0" and status["roots"][0]["available"] == "cents=1000",
              "the unsent reservation released: all 1000 available again")

        trip = {"to": "LHR", "nights": 2}
        p = await ledger(mine, ledger="permit", credit="3", gateway="agent-1", tool="book",
                         arguments=trip, purpose="travel", max="cents=50", key="b1")
        permit = p["permit"]
        check(isinstance(permit, str) and p["operation"] == "b1" and p["expires"].endswith("Z"),
              "a dispatch permit for book(LHR, 2 nights), from this caller's own node")
        status = (await ledger(mine, ledger="status"))["ledger"]
        check(status["roots"][0]["quarantined"] == "cents=50", "its 50 cents quarantined")

        async with stdio_client(gateway) as (gr, gw), ClientSession(gr, gw) as theirs:
            await theirs.initialize()
            r = await theirs.call_tool("book", {"to": "CDG", "nights": 2}, meta={PERMIT: permit})
            check(r.is_error, "the permit does not bind another call")
            r = await theirs.call_tool("book", trip, meta={PERMIT: permit})
            check(not r.is_error and r.content[0].text.strip() == "booked", "book ran under it")
            meta = r.meta or {}
            receipt = meta.get(RECEIPT)
            check(isinstance(receipt, str) and CHARGE not in meta,
                  "the receipt rides the result; the tool's own charge note does not")

        s = await ledger(mine, ledger="receipt", gateway="agent-1", receipt=receipt)
        check(s["state"] == "settled", "the receipt settles the operation")
        status = (await ledger(mine, ledger="status"))["ledger"]
        root = status["roots"][0]
        op = [o for o in status["operations"] if o["key"] == "b1"][0]
        check(op["charged"] == "cents=20" and root["committed"] == "cents=20"
              and root["available"] == "cents=980" and root["quarantined"] == "0",
              "20 of 50 committed, 30 back: partial settlement without an Executor")
    print("ledger surface: split, join, reserve, release, permit, book, receipt — 20 of 50 "
          "cents committed, 980 available", flush=True)


asyncio.run(main())
