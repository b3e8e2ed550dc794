"""The Client's connection handling, against a local HTTP server that
closes every connection after one answer, as a server closing an idle
keep-alive connection does, and against a port nobody listens on."""

from __future__ import annotations

import http.server
import threading
import unittest

from tests.harness import free_port

import taskledger


class OneShot(http.server.BaseHTTPRequestHandler):
    """Answers one request per connection with a keep-alive 200, then
    closes the connection without saying so."""

    protocol_version = "HTTP/1.1"
    seen: list[str] = []

    def answer(self) -> None:
        self.seen.append(self.command)
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    do_GET = do_POST = answer

    def log_message(self, *args: object) -> None:
        pass


class TransportTest(unittest.TestCase):
    def setUp(self) -> None:
        OneShot.seen = []
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OneShot)
        th = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        th.start()
        self.addCleanup(th.join)
        self.addCleanup(self.httpd.server_close)
        self.addCleanup(self.httpd.shutdown)
        self.client = taskledger.Client(f"http://127.0.0.1:{self.httpd.server_address[1]}", "tok")
        self.addCleanup(self.client.close)

    def test_get_retried_on_a_closed_keep_alive_connection(self) -> None:
        self.assertEqual(self.client.healthz(), {"status": "ok"})
        self.assertEqual(self.client.healthz(), {"status": "ok"})  # the reused connection was closed: retried
        self.assertEqual(OneShot.seen, ["GET", "GET"])

    def test_post_not_retried(self) -> None:
        self.client.rebuild_projections()
        with self.assertRaises(OSError):
            self.client.rebuild_projections()  # may have reached the server: not sent again
        self.assertEqual(OneShot.seen, ["POST"])
        self.client.rebuild_projections()  # a new connection for the next request
        self.assertEqual(OneShot.seen, ["POST", "POST"])


class UnreachableTest(unittest.TestCase):
    def test_refused(self) -> None:
        c = taskledger.Client(f"http://127.0.0.1:{free_port()}")
        with self.assertRaises(OSError):
            c.get("t1")
        c.close()

    def test_bad_base_url(self) -> None:
        for url in ("ftp://127.0.0.1", "127.0.0.1:8080", "http://"):
            with self.subTest(url=url), self.assertRaises(ValueError):
                taskledger.Client(url)


if __name__ == "__main__":
    unittest.main()
