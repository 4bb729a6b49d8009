"""Corral's MCP server driven by the official Python MCP SDK (the `mcp` package), over stdio
(`corral mcp`) and over Streamable HTTP (`/mcp` on the API). services/corral/tests/mcp.rs starts a
`corral up` and runs this with CORRAL_BIN, CORRAL_API_URL and CORRAL_API_TOKEN_FILE; each check
prints `ok <name>`, and the first failure raises."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
import sys
import uuid
import zlib

import httpx2
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

API = os.environ["CORRAL_API_URL"]
TOKEN = open(os.environ["CORRAL_API_TOKEN_FILE"], encoding="utf-8").read().strip()
TOOLS = {"run_code", "list_workspace", "read_workspace", "edit_workspace", "write_workspace",
         "browser_open", "browser_act", "browser_close"}

# A program that writes a 2x2 red PNG with the standard library alone.
PNG_PROGRAM = """
import struct, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
raw = b''.join(b'\\x00' + b'\\xff\\x00\\x00' * 2 for _ in range(2))
png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 2, 2, 8, 2, 0, 0, 0)) \\
    + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')
open('red.png', 'wb').write(png)
print('drew red.png')
"""


def ok(name: str) -> None:
    print(f"ok {name}", flush=True)


def texts(result) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def refused(session: ClientSession, name: str, arguments: dict, code: str) -> None:
    try:
        await session.call_tool(name, arguments)
    except MCPError as error:
        assert code in error.message or (error.data or {}).get("code") == code, (code, error.message, error.data)
        return
    raise AssertionError(f"{name} {arguments} was not refused ({code})")


async def exercise(session: ClientSession, transport: str) -> None:
    await session.initialize()
    listed = await session.list_tools()
    assert {tool.name for tool in listed.tools} == TOOLS, listed.tools
    ok(f"{transport}: tools listed")

    ran = await session.call_tool("run_code", {"code": "print(6 * 7)"})
    assert not ran.is_error, texts(ran)
    answer = json.loads(texts(ran))
    assert (answer["outcome"], answer["stdout"]) == ("succeeded", "42\n"), answer
    ok(f"{transport}: a run")

    drawn = await session.call_tool("run_code", {"code": PNG_PROGRAM})
    images = [block for block in drawn.content if block.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png", drawn.content
    assert base64.b64decode(images[0].data)[:8] == b"\x89PNG\r\n\x1a\n"
    ok(f"{transport}: an image result")

    persistent = [await session.call_tool("run_code", {"code": code, "kernel": "persistent"})
                  for code in ("items = [1]", "items.append(2)", "print(items)")]
    assert json.loads(texts(persistent[-1]))["stdout"] == "[1, 2]\n", texts(persistent[-1])
    ok(f"{transport}: a persistent kernel across three calls")

    written = await session.call_tool("write_workspace", {"path": "notes.txt", "text": "alpha\nbeta\n"})
    assert not written.is_error, texts(written)
    view = json.loads(texts(await session.call_tool("read_workspace", {"path": "notes.txt"})))
    line, rest = view["lines"].splitlines()[1].split(":", 1)
    edited = await session.call_tool("edit_workspace", {"path": "notes.txt", "edits": [
        {"op": "replace", "line": int(line), "tag": rest.split("|", 1)[0], "text": "gamma"}]})
    assert json.loads(texts(edited))["outcome"] == "applied", texts(edited)
    again = await session.call_tool("write_workspace", {"path": "notes.txt", "text": "x"})
    assert again.is_error and "workspace_path_exists" in texts(again), texts(again)
    ok(f"{transport}: the workspace written, read by anchors, edited; a refusal is an error result")

    await refused(session, "no_such_tool", {}, "tool_unknown")
    await refused(session, "run_code", {"code": 7}, "argument_invalid")
    await refused(session, "run_code", {"code": "print(1)", "actor": "someone-else"}, "identity_argument_refused")
    await refused(session, "read_workspace", {"path": "notes.txt", "conversation": "other"}, "identity_argument_refused")
    ok(f"{transport}: an unknown tool, a wrong type and an identity argument refused")


async def over_stdio() -> None:
    server = StdioServerParameters(
        command=os.environ["CORRAL_BIN"],
        args=["mcp", "--actor", "mcp-stdio", "--conversation", uuid.uuid4().hex],
        env={"CORRAL_API_URL": API, "CORRAL_API_TOKEN_FILE": os.environ["CORRAL_API_TOKEN_FILE"],
             "PATH": os.environ.get("PATH", "")},
    )
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await exercise(session, "stdio")


async def over_http() -> None:
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Corral-Actor": "mcp-http",
               "X-Corral-Conversation": uuid.uuid4().hex}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        async with streamable_http_client(f"{API}/mcp", http_client=http) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await exercise(session, "streamable http")
    # Without the caller credential: refused before the MCP server sees anything.
    async with httpx2.AsyncClient() as http:
        response = await http.post(f"{API}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                   headers={"Accept": "application/json, text/event-stream"})
        assert response.status_code == 401, response.status_code
        assert response.json()["error"]["code"] == "unauthorized", response.text
    ok("streamable http: an unauthenticated request refused")


if __name__ == "__main__":
    asyncio.run(over_stdio())
    asyncio.run(over_http())
    print("all ok")
    sys.exit(0)
