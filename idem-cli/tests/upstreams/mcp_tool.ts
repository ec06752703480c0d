// An MCP server on the official TypeScript SDK (@modelcontextprotocol/sdk) that knows nothing of
// idem: an upstream of `idem proxy --mcp`'s tests.
//
// Tools:
//   create_ticket(title)  side-effecting: each call appends one JSON line to its sink (--sink
//                         FILE) with the `_meta["io.idem/idempotencyKey"]` it received
//   count_tickets()       readOnlyHint: how many lines the sink holds (no effect)
//
// Transports: stdio (the default) or `--http PORT` (streamable HTTP at /mcp, stateless, JSON
// responses unless --sse; the first stdout line is `listening on http://127.0.0.1:PORT/mcp`).

import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { createServer, IncomingMessage, ServerResponse } from "node:http";
import { AddressInfo } from "node:net";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { z } from "zod";

const KEY_META = "io.idem/idempotencyKey";

function option(name: string): string | undefined {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
}

const sink = option("--sink");
if (!sink) {
  console.error("usage: mcp_tool.js --sink FILE [--http PORT [--sse]]");
  process.exit(2);
}

function count(): number {
  if (!existsSync(sink!)) return 0;
  return readFileSync(sink!, "utf8").split("\n").filter((l) => l.length > 0).length;
}

function build(): McpServer {
  const server = new McpServer({ name: "fixture-typescript-mcp", version: "1.0.0" });
  server.registerTool(
    "create_ticket",
    {
      description: "Creates a ticket (a line in the sink).",
      inputSchema: { title: z.string() },
      annotations: { readOnlyHint: false, idempotentHint: false },
    },
    async ({ title }, extra) => {
      const key = extra._meta?.[KEY_META] ?? null;
      // One write of one line: the effect.
      appendFileSync(sink!, JSON.stringify({ title, key }) + "\n");
      return { content: [{ type: "text", text: `ticket ${count()}: ${title}` }] };
    },
  );
  server.registerTool(
    "count_tickets",
    { description: "How many tickets exist.", annotations: { readOnlyHint: true } },
    async () => ({ content: [{ type: "text", text: String(count()) }] }),
  );
  return server;
}

async function body(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const text = Buffer.concat(chunks).toString("utf8");
  return text.length > 0 ? JSON.parse(text) : undefined;
}

async function main(): Promise<void> {
  const port = option("--http");
  if (port === undefined) {
    await build().connect(new StdioServerTransport());
    return;
  }
  const json = !process.argv.includes("--sse");
  const http = createServer(async (req: IncomingMessage, res: ServerResponse) => {
    if (!req.url?.startsWith("/mcp")) {
      res.writeHead(404).end();
      return;
    }
    // Stateless: a server and a transport per request, as the SDK's stateless example does.
    const server = build();
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: undefined,
      enableJsonResponse: json,
    });
    res.on("close", () => {
      void transport.close();
      void server.close();
    });
    try {
      await server.connect(transport);
      await transport.handleRequest(req, res, req.method === "POST" ? await body(req) : undefined);
    } catch (e) {
      if (!res.headersSent) res.writeHead(400).end(String(e));
    }
  });
  http.listen(Number(port), "127.0.0.1", () => {
    const address = http.address() as AddressInfo;
    console.log(`listening on http://127.0.0.1:${address.port}/mcp`);
  });
}

void main();
