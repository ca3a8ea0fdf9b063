"""A minimal Iceberg REST catalog over pyiceberg's SQL catalog, on loopback: what DuckDB's
iceberg extension needs to commit to a table (it writes only through a REST catalog), so
that the tests can read tables with merge-on-read delete files a real writer made.

It serves the catalog's configuration, namespaces, table loads and table commits (a commit
is pyiceberg's `commit_table`, with its requirement checks); nothing else.
"""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import TypeAdapter
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import CommitTableRequest

_TABLE = re.compile(r"^/v1/namespaces/([^/]+)/tables/([^/?]+)")
_TABLES = re.compile(r"^/v1/namespaces/([^/]+)/tables/?$")
_NAMESPACE = re.compile(r"^/v1/namespaces/([^/?]+)$")


def _handler(catalog):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status, body=None):
            data = b"" if body is None else body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status, message):
            error = {"message": message, "type": "Error", "code": status}
            self._send(status, json.dumps({"error": error}))

        def _load(self, namespace, name):
            table = catalog.load_table(f"{namespace}.{name}")
            return json.dumps(
                {
                    "metadata-location": table.metadata_location,
                    "metadata": json.loads(table.metadata.model_dump_json(by_alias=True)),
                    "config": {},
                }
            )

        def _commit(self, name, request):
            table = catalog.load_table(name)
            return catalog.commit_table(table, tuple(request.requirements), tuple(request.updates))

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            try:
                if path == "/v1/config":
                    return self._send(200, json.dumps({"defaults": {}, "overrides": {}}))
                if path == "/v1/namespaces":
                    found = [list(n) for n in catalog.list_namespaces()]
                    return self._send(200, json.dumps({"namespaces": found}))
                if m := _NAMESPACE.match(path):
                    return self._send(200, json.dumps({"namespace": [m[1]], "properties": {}}))
                if m := _TABLES.match(path):
                    found = [
                        {"namespace": [m[1]], "name": t[-1]} for t in catalog.list_tables(m[1])
                    ]
                    return self._send(200, json.dumps({"identifiers": found}))
                if m := _TABLE.match(path):
                    return self._send(200, self._load(m[1], m[2]))
            except NoSuchTableError as e:
                return self._error(404, str(e))
            return self._error(404, f"not served: GET {path}")

        def do_HEAD(self):
            path = self.path.split("?", 1)[0]
            if m := _TABLE.match(path):
                exists = catalog.table_exists(f"{m[1]}.{m[2]}")
                return self._send(204 if exists else 404)
            if _NAMESPACE.match(path):
                return self._send(204)
            return self._send(404)

        def do_POST(self):
            path = self.path.split("?", 1)[0]
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                if path == "/v1/transactions/commit":
                    # DuckDB commits through the multi-table endpoint, one change per table
                    # (not atomic across tables here: the tests commit one at a time).
                    for change in json.loads(body)["table-changes"]:
                        request = TypeAdapter(CommitTableRequest).validate_python(change)
                        ident = request.identifier
                        self._commit(".".join([*ident.namespace.root, ident.name]), request)
                    return self._send(204)
                m = _TABLE.match(path)
                if m is None:
                    return self._error(404, f"not served: POST {path}")
                request = TypeAdapter(CommitTableRequest).validate_json(body)
                response = self._commit(f"{m[1]}.{m[2]}", request)
            except CommitFailedException as e:
                return self._error(409, str(e))
            except NoSuchTableError as e:
                return self._error(404, str(e))
            return self._send(
                200,
                json.dumps(
                    {
                        "metadata-location": response.metadata_location,
                        "metadata": json.loads(response.metadata.model_dump_json(by_alias=True)),
                    }
                ),
            )

    return Handler


def serve(catalog):
    """Serves `catalog` on a free loopback port; returns (endpoint, server)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(catalog))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server
