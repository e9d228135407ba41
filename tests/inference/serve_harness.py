"""A real `ds serve` subprocess on 127.0.0.1 for the serving tests: start it, talk to it with
httpx and the OpenAI client, stop it; and the check of OpenAI's error body."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serve_model import serve_command
from world import free_port

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

KEY = "sk-ds-test"
MODEL = "tiny-serve"


class Server:
    def __init__(self, proc: subprocess.Popen[str], port: int, model_dir: Path) -> None:
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"
        self.model_dir = model_dir
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
        )
        self.client = openai.OpenAI(
            base_url=self.url + "/v1", api_key=KEY, max_retries=0, timeout=120
        )

    def post(self, path: str, body: Any = None, raw: bytes | None = None) -> Any:
        content = raw if raw is not None else json.dumps(body).encode()
        return self.http.post(path, content=content, headers={"content-type": "application/json"})

    def complete(self, **body: Any) -> dict[str, Any]:
        r = self.post("/v1/completions", {"model": MODEL, **body})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def chat(self, **body: Any) -> dict[str, Any]:
        r = self.post("/v1/chat/completions", {"model": MODEL, **body})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def stream(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        chunks = []
        with self.http.stream("POST", path, json={"model": MODEL, **body, "stream": True}) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        return chunks

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels``."""
        text = self.http.get("/metrics").text
        total = 0.0
        for line in text.splitlines():
            if not (line.startswith(name + "{") or line.startswith(name + " ")):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def free_blocks(self) -> int:
        return int(self.http.get("/health").json()["free_blocks"])


def running_server(model_dir: Path, *args: str) -> Iterator[Server]:
    """``ds serve MODEL_DIR ARGS`` with the test API key, until the generator is closed."""
    port = free_port()
    proc = subprocess.Popen(
        [*serve_command(), str(model_dir), "--port", str(port), "--api-key", KEY, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    srv = Server(proc, port, model_dir)
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"ds serve exited early:\n{proc.stdout.read() if proc.stdout else ''}")
        try:
            if srv.http.get("/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("ds serve did not come up within 180 s")
        time.sleep(0.5)
    yield srv
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def check_error(r: Any, status: int, param: str | None, *words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    for w in words:
        assert w in err["message"], err
