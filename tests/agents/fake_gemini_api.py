#!/usr/bin/env python3
"""A scripted stand-in for the Gemini API on 127.0.0.1, for running the real Gemini CLI in CI.

It answers the CLI's generateContent / streamGenerateContent calls with a fixed plan, whatever the
prompt says: first a write_file call that appends MARKER to the kernel, then (with --judge) a call
to the MCP tool whose name ends in "judge", then a final text. Every answer carries usageMetadata,
so the CLI's own usage report has figures to show. Each request is appended to --log as one JSON
line, so a test can read what the CLI sent back (the judge's verdict among it).

With --write-as REL the write_file call names REL, which the CLI resolves against its own working
directory (an agent session's worktree), while the content is still read from --kernel (HEAD's copy).

Usage: fake_gemini_api.py --kernel ABS_PATH [--write-as REL] --marker TEXT [--judge] --log FILE --port-file FILE
"""
import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

USAGE = {"promptTokenCount": 3456, "candidatesTokenCount": 78, "totalTokenCount": 3534}


def declared_tools(body):
    names = {}
    for tool in body.get("tools") or []:
        for decl in tool.get("functionDeclarations") or []:
            names[decl["name"]] = decl
    return names


def tool_results(body):
    """The function responses the CLI has sent back so far, in order."""
    out = []
    for content in body.get("contents") or []:
        for part in content.get("parts") or []:
            if "functionResponse" in part:
                out.append(part["functionResponse"])
    return out


def next_part(body, args):
    tools = declared_tools(body)
    done = tool_results(body)
    plan = ["write"] + (["judge"] if args.judge else [])
    if len(done) < len(plan) and not tools:
        # A side request (a summary, a routing check) with no tools: a plain answer.
        return {"text": "ok"}
    if len(done) >= len(plan):
        return {"text": "DONE: proposed edit written" + (" and judged." if args.judge else ".")}
    step = plan[len(done)]
    if step == "write":
        decl = tools.get("write_file")
        if decl is None:
            return {"text": "no write_file tool was offered: " + ", ".join(sorted(tools))}
        props = (decl.get("parameters") or decl.get("parametersJsonSchema") or {}).get("properties", {})
        path_key = "file_path" if "file_path" in props else "path"
        with open(args.kernel) as f:
            original = f.read()
        content = original + "\n" + args.marker + "\n"
        target = args.write_as or args.kernel
        return {"functionCall": {"name": "write_file", "args": {path_key: target, "content": content}}}
    judge = [n for n in tools if n.endswith("judge")]
    if not judge:
        return {"text": "no judge tool was offered: " + ", ".join(sorted(tools))}
    return {"functionCall": {"name": judge[0], "args": {}}}


def response(part):
    return {
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": USAGE,
        "modelVersion": "gemini-fake",
    }


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        with open(self.server.args.log, "a") as log:
            log.write(json.dumps({"path": self.path, "body": body}) + "\n")
        if ":countTokens" in self.path:
            return self.send_json({"totalTokens": USAGE["promptTokenCount"]})
        part = next_part(body, self.server.args)
        if ":streamGenerateContent" in self.path:
            data = "data: " + json.dumps(response(part)) + "\r\n\r\n"
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(data.encode())))
            self.end_headers()
            self.wfile.write(data.encode())
            return
        if ":generateContent" in self.path:
            return self.send_json(response(part))
        self.send_json({"error": {"code": 404, "message": "fake API: no " + self.path, "status": "NOT_FOUND"}}, 404)

    def do_GET(self):
        self.send_json({"models": [{"name": "models/gemini-fake"}]})

    def send_json(self, value, status=200):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kernel", required=True)
    p.add_argument("--write-as")
    p.add_argument("--marker", required=True)
    p.add_argument("--judge", action="store_true")
    p.add_argument("--log", required=True)
    p.add_argument("--port-file", required=True)
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.args = args
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    import os

    os.replace(args.port_file + ".tmp", args.port_file)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
