"""OpenAI's error object for every 4xx/5xx the server sends.

``{"error": {"message", "type", "param", "code"}}`` is what OpenAI clients parse into their
exception; FastAPI's own shapes (422 ``{"detail": [...]}`` for validation, ``{"detail": "Not
Found"}``) are replaced by it, and malformed input is a 400 as at OpenAI.
"""

from __future__ import annotations

from typing import Any

from ds.interfaces.logging import get_logger

log = get_logger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class APIError(Exception):
    """Raised by request handling; becomes an OpenAI error response."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "server_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(param: str, message: str) -> APIError:
    return APIError(400, f"Invalid '{param}': {message}", param=param, code="invalid_value")


def needs_grammar(what: str, param: str) -> APIError:
    """The 400 for structured output or tools on a server without xgrammar or a tokenizer."""
    return APIError(
        400,
        f"{what} needs a grammar library and a tokenizer: install xgrammar "
        "(pip install 'ds-inference-v2[serve]') and serve a model with tokenizer.json",
        param=param,
        code="unsupported",
    )


def install_handlers(app: Any) -> None:
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    def respond(err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(APIError)
    async def _api(_: Any, exc: APIError) -> JSONResponse:
        return respond(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Any, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or None
        message = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in errors
        )
        return respond(APIError(400, message or "invalid request", param=loc))

    @app.exception_handler(HTTPException)
    async def _http(_: Any, exc: HTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return respond(APIError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(Exception)
    async def _internal(_: Any, exc: Exception) -> JSONResponse:
        # Reaching here is a server bug, not bad input: say so without leaking a traceback.
        log.error("unhandled error in request", error=repr(exc))
        return respond(APIError(500, f"internal server error: {type(exc).__name__}"))
