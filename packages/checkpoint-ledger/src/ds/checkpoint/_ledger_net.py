"""One writer, many ranks: rank 0 serves its ledger over TCP; other ranks call it.

Each request is one JSON line ``{"op": ..., **args}``, each reply one JSON line ``{"ok": value}``
or ``{"error": message}``. Calls are synchronous, so an event is on disk (handed to the OS) when
``record_training_event`` returns on any rank.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
from dataclasses import asdict
from typing import Any

from ds.interfaces.errors import LedgerError


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        ledger = self.server.ledger  # type: ignore[attr-defined]
        for raw in self.rfile:
            try:
                req = json.loads(raw)
                op = req.pop("op")
                value = _dispatch(ledger, op, req)
                reply = {"ok": value}
            except Exception as exc:  # the caller's rank raises it
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            self.wfile.write(json.dumps(reply).encode() + b"\n")
            self.wfile.flush()


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


class LedgerServer:
    def __init__(self, ledger: Any, bind: str = "") -> None:
        self._server = _Server((bind, 0), _Handler)
        self._server.ledger = ledger  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ds-ledger-server", daemon=True
        )
        self._thread.start()
        host = os.environ.get("DS_LEDGER_HOST") or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        self.address = (host, self._server.server_address[1])

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class LedgerClient:
    def __init__(self, address: tuple[str, int], rank: int, timeout_s: float = 60.0) -> None:
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

    def call(self, op: str, **args: Any) -> Any:
        if op == "record":
            args["rank"] = self._rank
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
