"""One writer, many ranks: rank 0 serves its ledger over TCP; other ranks call it.

The channel is the job's, not the network's: the server binds to the rendezvous interface
(``DS_LEDGER_HOST``, else the address ``MASTER_ADDR`` resolves to, else 127.0.0.1), never to every
interface by default, and admits only peers that prove they hold the job secret. The secret is made
by rank 0 and reaches the other ranks through the job's own process group (see
``RunLedger``), so only members of the rendezvous learn it.

Handshake: the server sends ``{"nonce": hex}``; the client answers ``{"rank": r, "mac": hex}`` with
``mac = HMAC-SHA256(secret, "ds-ledger-auth-v1|" + nonce + "|" + r)``. A wrong or missing answer is
logged and the connection closed. The rank a record is attributed to is the authenticated one.

Then each request is one JSON line ``{"op": ..., **args}``, each reply one JSON line ``{"ok": value}``
or ``{"error": message}``. Calls are synchronous, so an event is on disk (handed to the OS) when
``record_training_event`` returns on any rank.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import socketserver
import sys
import threading
from dataclasses import asdict
from typing import Any

from ds.interfaces.errors import LedgerError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

_AUTH = b"ds-ledger-auth-v1|"
_HANDSHAKE_S = 10.0
_MAX_LINE = 1 << 16


def auth_mac(secret: str, nonce: str, rank: int) -> str:
    msg = _AUTH + nonce.encode() + b"|" + str(int(rank)).encode()
    return hmac.new(bytes.fromhex(secret), msg, hashlib.sha256).hexdigest()


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        rank = self._authenticate(server)
        if rank is None:
            return
        for raw in self.rfile:
            try:
                req = json.loads(raw)
                op = req.pop("op")
                req["rank"] = rank  # never the rank a request claims
                value = _dispatch(server.ledger, op, req)
                reply = {"ok": value}
            except Exception as exc:  # the caller's rank raises it
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            self.wfile.write(json.dumps(reply).encode() + b"\n")
            self.wfile.flush()

    def _authenticate(self, server: _Server) -> int | None:
        nonce = secrets.token_hex(16)
        peer = f"{self.client_address[0]}:{self.client_address[1]}"
        try:
            self.connection.settimeout(_HANDSHAKE_S)
            self.wfile.write(json.dumps({"nonce": nonce}).encode() + b"\n")
            self.wfile.flush()
            hello = json.loads(self.rfile.readline(_MAX_LINE))
            rank = int(hello["rank"])
            ok = hmac.compare_digest(str(hello["mac"]), auth_mac(server.secret, nonce, rank))
        except (OSError, ValueError, KeyError, TypeError):
            ok, rank = False, -1
        if not ok:
            with server.refused_lock:
                server.refused += 1
                count = server.refused
            _trace_refusal(count, peer, server.ledger.path)
            log.warning(
                "ledger writer refused a connection without the job secret",
                peer=peer,
                ledger=server.ledger.path,
            )
            return None
        self.connection.settimeout(None)
        return rank


def _trace_refusal(count: int, peer: str, path: Any) -> None:
    """A line on stderr for refusals 1, 2, 4, 8, ... when logging would drop the warning: a
    library's loggers have only a NullHandler until the application configures logging."""
    if count & (count - 1):
        return
    logger: logging.Logger | None = logging.getLogger(__name__)
    while logger is not None:
        if any(not isinstance(h, logging.NullHandler) for h in logger.handlers):
            return
        logger = logger.parent if logger.propagate else None
    import structlog

    if structlog.is_configured():
        return
    print(
        f"ds ledger: refused a connection from {peer} without the job secret ({count} refused "
        f"so far; ledger {path})",
        file=sys.stderr,
        flush=True,
    )


def _dispatch(ledger: Any, op: str, args: dict[str, Any]) -> Any:
    if op == "record":
        return ledger._append(args["kind"], args["payload"], int(args["rank"]))
    if op == "head":
        return asdict(ledger.tree_head())
    if op == "verify":
        return asdict(ledger.verify_ledger_integrity())
    if op == "prove_inclusion":
        return ledger.prove_inclusion(args["index"], args.get("tree_size"))
    if op == "prove_consistency":
        return ledger.prove_consistency(args["old_size"], args.get("new_size"))
    if op == "leaf_hash":
        return ledger.leaf_hash(args["index"])
    if op == "root_hash":
        return ledger.root_hash(args.get("size"))
    if op == "size":
        return len(ledger)
    raise LedgerError(f"unknown ledger request {op!r}")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    ledger: Any
    secret: str
    refused = 0  # connections refused for want of the job secret
    refused_lock = threading.Lock()


def rendezvous_host() -> str:
    """The interface the writer binds to: the job's rendezvous address, else loopback."""
    host = os.environ.get("DS_LEDGER_HOST") or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise LedgerError(
            f"cannot resolve the ledger writer's address {host!r} ({exc}); set DS_LEDGER_HOST "
            "to an address of rank 0 that the other ranks can reach"
        ) from exc


class LedgerServer:
    def __init__(self, ledger: Any, bind: str | None = None) -> None:
        host = rendezvous_host() if bind is None else bind
        try:
            self._server = _Server((host, 0), _Handler)
        except OSError as exc:
            raise LedgerError(
                f"the ledger writer cannot listen on {host} ({exc}); set DS_LEDGER_HOST to an "
                "address of this node that the other ranks can reach"
            ) from exc
        self.secret = secrets.token_hex(32)
        self._server.ledger = ledger
        self._server.secret = self.secret
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ds-ledger-server", daemon=True
        )
        self._thread.start()
        bound = self._server.server_address[0]
        advertised = (
            bound
            if bound not in ("0.0.0.0", "::")
            else (os.environ.get("MASTER_ADDR") or "127.0.0.1")
        )
        self.address = (advertised, self._server.server_address[1])

    @property
    def refused(self) -> int:
        """How many connections were refused for want of the job secret."""
        return self._server.refused

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class LedgerClient:
    def __init__(
        self, address: tuple[str, int], rank: int, secret: str, timeout_s: float = 60.0
    ) -> None:
        self._rank = rank
        try:
            self._sock = socket.create_connection((str(address[0]), int(address[1])), timeout_s)
        except OSError as exc:
            raise LedgerError(
                f"rank {rank} cannot reach the ledger writer on rank 0 at {address[0]}:{address[1]} "
                f"({exc}); set DS_LEDGER_HOST to an address of rank 0 reachable from this node"
            ) from exc
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._r = self._sock.makefile("rb")
        self._lock = threading.Lock()
        hello = json.loads(self._r.readline(_MAX_LINE) or b"{}")
        if "nonce" not in hello:
            raise LedgerError(f"rank {rank}: the ledger writer at {address} sent no handshake")
        mac = auth_mac(secret, str(hello["nonce"]), rank)
        self._sock.sendall(json.dumps({"rank": rank, "mac": mac}).encode() + b"\n")
        self._sock.settimeout(None)

    def call(self, op: str, **args: Any) -> Any:
        with self._lock:
            self._sock.sendall(json.dumps({"op": op, **args}, default=str).encode() + b"\n")
            line = self._r.readline()
        if not line:
            raise LedgerError("the ledger writer on rank 0 closed the connection")
        reply = json.loads(line)
        if "error" in reply:
            raise LedgerError(f"ledger writer on rank 0: {reply['error']}")
        return reply["ok"]

    def close(self) -> None:
        self._r.close()
        self._sock.close()
