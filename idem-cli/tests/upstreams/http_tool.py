#!/usr/bin/env python3
"""An HTTP tool server that knows nothing of idem: the upstream of `idem proxy`'s tests.

Standard library only. Every POST, PUT, PATCH and DELETE is an effect: a row in its own SQLite
sink (--sink FILE), committed before it answers, with the method, path, body and the
`Idempotency-Key` header it received. `GET /_sink` reports them; any other GET is a read, counted
too, and answered with how many reads came before.

A request can ask for a behaviour with headers (the proxy forwards them like any other):

  x-fixture-status: N       answer N instead of 201; N >= 400 records no effect (a 5xx, 429...)
  x-fixture-delay-ms: N     wait N ms before answering (after the effect)
  x-fixture-block: NAME     after the effect, answer only once the test posts
                            /_control/release?name=NAME; GET /_control/arrived?name=NAME
                            answers as soon as such a request has recorded its effect
  x-fixture-reset: 1        record the effect, then close the connection without an answer
  x-fixture-garbage: 1      record the effect, then answer bytes that are not HTTP
  x-fixture-bytes: N        answer a text body of N bytes

Each request's row also says whether it carried an `Authorization` header (never its value).

With --dedupe it deduplicates by the `Idempotency-Key` it receives, as a provider with an
idempotency contract does: a key it has seen gets the first answer again and no new effect.

The first line on stdout is `listening on http://127.0.0.1:PORT`.
"""

import argparse
import json
import socket
import sqlite3
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

EFFECT_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class Sink:
    """The effects, in a SQLite file of their own."""

    def __init__(self, path):
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.lock = threading.Lock()
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY, method TEXT, path TEXT,"
            " idempotency_key TEXT, body TEXT, status INTEGER, effect INTEGER, answer TEXT,"
            " authorization INTEGER)"
        )
        self.db.execute("CREATE TABLE IF NOT EXISTS reads (id INTEGER PRIMARY KEY, path TEXT)")

    def record(self, method, path, key, body, status, authorization):
        with self.lock:
            cur = self.db.execute(
                "INSERT INTO requests (method, path, idempotency_key, body, status, effect,"
                " authorization) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (method, path, key, body, status, 1 if status < 400 else 0, authorization),
            )
            return cur.lastrowid

    def keep_answer(self, row, answer):
        with self.lock:
            self.db.execute("UPDATE requests SET answer = ? WHERE id = ?", (answer, row))

    def answer_for_key(self, key):
        with self.lock:
            found = self.db.execute(
                "SELECT answer FROM requests WHERE idempotency_key = ? AND effect = 1"
                " AND answer IS NOT NULL ORDER BY id LIMIT 1",
                (key,),
            ).fetchone()
        return found[0] if found else None

    def read(self, path):
        with self.lock:
            return self.db.execute("INSERT INTO reads (path) VALUES (?)", (path,)).lastrowid

    def report(self):
        with self.lock:
            rows = self.db.execute(
                "SELECT id, method, path, idempotency_key, body, status, effect, authorization"
                " FROM requests"
                " ORDER BY id"
            ).fetchall()
            reads = self.db.execute("SELECT count(*) FROM reads").fetchone()[0]
        requests = [
            {"id": r[0], "method": r[1], "path": r[2], "idempotency_key": r[3], "body": r[4],
             "status": r[5], "effect": bool(r[6]), "authorization": bool(r[7])}
            for r in rows
        ]
        return {"effects": sum(1 for r in requests if r["effect"]), "reads": reads,
                "requests": requests}


class Gates:
    """Named gates: a request blocks on one until the test releases it."""

    def __init__(self):
        self.cond = threading.Condition()
        self.arrived = set()
        self.released = set()

    def arrive_and_wait(self, name):
        with self.cond:
            self.arrived.add(name)
            self.cond.notify_all()
            self.cond.wait_for(lambda: name in self.released)

    def wait_arrived(self, name):
        with self.cond:
            self.cond.wait_for(lambda: name in self.arrived)

    def release(self, name):
        with self.cond:
            self.released.add(name)
            self.cond.notify_all()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fixture-tool/1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, content_type="application/json", extra=()):
        data = body if isinstance(body, bytes) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == "/_sink":
            return self.answer(200, json.dumps(self.server.sink.report()))
        if url.path == "/_control/arrived":
            self.server.gates.wait_arrived(query["name"][0])
            return self.answer(200, "{}")
        n = self.server.sink.read(url.path)
        self.answer(200, json.dumps({"read": n, "path": url.path}))

    def do_HEAD(self):
        self.answer(200, b"")

    def effect(self):
        url = urlsplit(self.path)
        if url.path == "/_control/release":
            self.server.gates.release(parse_qs(url.query)["name"][0])
            return self.answer(200, "{}")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace")
        key = self.headers.get("Idempotency-Key")
        if self.server.dedupe and key:
            kept = self.server.sink.answer_for_key(key)
            if kept is not None:
                kept = json.loads(kept)
                return self.answer(kept["status"], kept["body"], extra=[("X-Deduplicated", "true")])
        status = int(self.headers.get("x-fixture-status") or 201)
        authorization = "Authorization" in self.headers
        row = self.server.sink.record(self.command, url.path, key, body, status, authorization)
        answer = json.dumps({"effect_id": row, "method": self.command, "path": url.path,
                             "received": body})
        # Kept before any wait: a provider's deduplication knows the operation once it happened.
        self.server.sink.keep_answer(row, json.dumps({"status": status, "body": answer}))
        gate = self.headers.get("x-fixture-block")
        if gate:
            self.server.gates.arrive_and_wait(gate)
        delay = int(self.headers.get("x-fixture-delay-ms") or self.server.delay_ms)
        if delay:
            threading.Event().wait(delay / 1000)
        if self.headers.get("x-fixture-reset"):
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        if self.headers.get("x-fixture-garbage"):
            self.wfile.write(b"this is not HTTP at all\r\n\r\n")
            self.close_connection = True
            return
        size = self.headers.get("x-fixture-bytes")
        if size:
            return self.answer(status, b"x" * int(size), "text/plain")
        self.answer(status, answer, extra=[
            ("Location", f"/effects/{row}"),
            # Unique per answer: a replay that carries it was not produced again.
            ("X-Upstream-Answer", str(uuid.uuid4())),
            ("Set-Cookie", f"effect={row}; Path=/"),
            ("Set-Cookie", "fixture=1; Path=/"),
        ])

    do_POST = do_PUT = do_PATCH = do_DELETE = effect


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--sink", required=True, help="the SQLite file the effects go to")
    parser.add_argument("--delay-ms", type=int, default=0)
    parser.add_argument("--dedupe", action="store_true")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.sink = Sink(args.sink)
    server.gates = Gates()
    server.delay_ms = args.delay_ms
    server.dedupe = args.dedupe
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
