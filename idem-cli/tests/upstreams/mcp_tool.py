#!/usr/bin/env python3
"""An MCP server on the official Python SDK (`mcp` 2.x) that knows nothing of idem: an upstream
of `idem proxy --mcp`'s tests.

Tools:
  create_ticket(title)  side-effecting: each call is a row in its own SQLite sink (--sink FILE),
                        with the `_meta["io.idem/idempotencyKey"]` it received; answers the row's id
  count_tickets()       `readOnlyHint`: how many rows the sink holds (no effect)

With --block-file PATH, create_ticket records its effect and then answers only once PATH
exists (the test creates it): a call the upstream holds while its caller is killed.

Transports: stdio (the default; the agent runtime's child) or `--http PORT` (streamable HTTP at
/mcp, stateless, JSON responses unless --sse; the first stdout line is
`listening on http://127.0.0.1:PORT/mcp`).
"""

import argparse
import os
import sqlite3
import sys
import threading

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

KEY_META = "io.idem/idempotencyKey"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sink", required=True)
    parser.add_argument("--http", type=int, metavar="PORT")
    parser.add_argument("--sse", action="store_true", help="answer over SSE instead of JSON")
    parser.add_argument("--block-file", help="answer create_ticket only once this file exists")
    args = parser.parse_args()

    db = sqlite3.connect(args.sink, check_same_thread=False, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS tickets (id INTEGER PRIMARY KEY, title TEXT, key TEXT)")
    lock = threading.Lock()
    server = MCPServer("fixture-python-mcp")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=False))
    async def create_ticket(title: str, ctx: Context) -> str:
        """Creates a ticket (a row in the sink)."""
        params = ctx.request_context.params or {}
        key = (params.get("_meta") or {}).get(KEY_META)
        with lock:
            row = db.execute("INSERT INTO tickets (title, key) VALUES (?, ?)", (title, key)).lastrowid
        while args.block_file and not os.path.exists(args.block_file):
            await anyio.sleep(0.02)
        return f"ticket {row}: {title}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def count_tickets() -> str:
        """How many tickets exist."""
        with lock:
            return str(db.execute("SELECT count(*) FROM tickets").fetchone()[0])

    if args.http is None:
        server.run("stdio")
        return 0
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", args.http))
    # Listening before the line is printed: a client that read it is queued, not refused, until
    # the server accepts.
    sock.listen(128)
    port = sock.getsockname()[1]
    app = server.streamable_http_app(json_response=not args.sse, stateless_http=True)
    print(f"listening on http://127.0.0.1:{port}/mcp", flush=True)
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
