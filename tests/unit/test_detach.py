"""``python -m detokenizer_proc --detach`` against a stand-in server: an HTTP status endpoint
that wants the server's API key, and the scheduler's PULL socket, which must receive the
`DrainReplica`. No model, no launch."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import zmq

from detokenizer_proc.detach import detach, status_url
from protocol import codec, endpoints
from protocol.config import ModelSource, ServerArgs
from protocol.messages import DrainReplica

KEY = "s3cret"


class StandIn:
    """The status endpoint (replica 0 live until a DrainReplica reaches the scheduler
    socket, then gone) and the scheduler socket of a server in `run_dir`."""

    def __init__(self, run_dir: str):
        self.gone = threading.Event()
        self.auth_seen: list[str | None] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                stand_in.auth_seen.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self.send_response(401)
                    self.end_headers()
                    return
                state = "gone" if stand_in.gone.is_set() else "live"
                body = json.dumps(
                    {
                        "replicas": [
                            {
                                "index": 0,
                                "pid": 1,
                                "state": state,
                                "attached": True,
                                "load": 0,
                                "routed": 0,
                                "reseeded": 0,
                            }
                        ]
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.ctx = zmq.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.bind(endpoints.scheduler(run_dir))
        self.received: list = []
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        threading.Thread(target=self._scheduler, daemon=True).start()

    def _scheduler(self) -> None:
        if self.inbox.poll(30_000):
            self.received.append(codec.to_scheduler.decode(self.inbox.recv()))
            self.gone.set()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.inbox.close(linger=0)
        self.ctx.term()


@pytest.fixture
def stand_in(tmp_path):
    run_dir = endpoints.make_run_dir(str(tmp_path / "run"))
    s = StandIn(str(run_dir))
    ServerArgs(
        model=ModelSource("hf", str(tmp_path), "m"), run_dir=str(run_dir), port=s.http.server_port, api_key=KEY
    ).save()
    yield s, str(run_dir)
    s.close()


def test_detach_sends_the_servers_api_key(stand_in, capsys):
    """With --api-key set, --detach failed at once: `cannot read the replica status at
    http://127.0.0.1:PORT/v1/internal/detokenizers: HTTP Error 401: Unauthorized` (exit 2),
    as it sent no key. It reads the key from the run directory's server args, like the
    other processes."""
    s, run_dir = stand_in
    assert detach(run_dir, 0, wait_s=30) == 0, capsys.readouterr().err
    assert s.received == [DrainReplica(0)]
    assert s.auth_seen and set(s.auth_seen) == {f"Bearer {KEY}"}
    assert "detokenizer replica 0 left" in capsys.readouterr().out


def test_status_url_reaches_wildcard_and_ipv6_hosts():
    assert status_url("0.0.0.0", 8) == "http://127.0.0.1:8/v1/internal/detokenizers"
    assert status_url("::", 8) == "http://127.0.0.1:8/v1/internal/detokenizers"
    assert status_url("10.0.0.1", 8) == "http://10.0.0.1:8/v1/internal/detokenizers"
    assert status_url("::1", 8) == "http://[::1]:8/v1/internal/detokenizers"
