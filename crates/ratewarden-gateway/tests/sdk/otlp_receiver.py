"""An OTLP trace receiver for tests/tracing.rs, made from the official
protobuf definitions (PyPI's `opentelemetry-proto`; gRPC through `grpcio`).

    python otlp_receiver.py http|grpc

Listens on a free loopback port and prints `port=N`, then one JSON line per
span received: its ids in hex, name, kind, attributes, events, status, and
its resource's attributes. Stops when its standard input closes.
"""

import json
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def dump(request):
    for rs in request.resource_spans:
        resource = {a.key: value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                print(json.dumps({
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent": s.parent_span_id.hex(),
                    "trace_state": s.trace_state,
                    "name": s.name,
                    "kind": s.kind,
                    "start": s.start_time_unix_nano,
                    "end": s.end_time_unix_nano,
                    "attrs": {a.key: value(a.value) for a in s.attributes},
                    "events": [{"name": e.name, "attrs": {a.key: value(a.value) for a in e.attributes}} for e in s.events],
                    "status": {"code": s.status.code, "message": s.status.message},
                    "resource": resource,
                    "scope": ss.scope.name,
                }), flush=True)


class Http(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        ok = self.path == "/v1/traces" and self.headers.get("content-type") == "application/x-protobuf"
        if ok:
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            dump(request)
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200 if ok else 400)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def main():
    mode = sys.argv[1]
    if mode == "http":
        server = ThreadingHTTPServer(("127.0.0.1", 0), Http)
        print(f"port={server.server_address[1]}", flush=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    else:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                dump(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        print(f"port={port}", flush=True)
    sys.stdin.read()


main()
