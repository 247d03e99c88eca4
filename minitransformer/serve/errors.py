"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Statuses as OpenAI uses them: 400 a bad request (malformed JSON, an unknown field, a wrong type,
a value out of range, a prompt the model cannot read), 401 a missing or wrong API key, 404 an
unknown model or path, 413 a body over the size limit, 429 a full request queue, 500 a bug.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
         404: "invalid_request_error", 405: "invalid_request_error",
         413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
         503: "server_error"}


class APIError(Exception):
    """An error answered to the client; ``status`` picks the HTTP status and error type."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status,
                        headers=headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None, str]:
    """One line from pydantic's list of problems: the first one, with the field it names."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None, "invalid_request"
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None, "invalid_json"
    if first.get("type") == "missing" and not loc:
        return "the request body is empty: send a JSON object", None, "invalid_json"
    if first.get("type") == "extra_forbidden":  # a field no schema names: OpenAI's words
        name = ".".join(loc)
        return f"Unrecognized request argument supplied: {name}", name, "unknown_parameter"
    param = loc[0] if loc else None  # the field (pydantic adds the union member's type)
    where = f"{param}: " if param else ""
    message = first.get("msg", "invalid value").removeprefix("Value error, ")  # our own words
    return f"{where}{message}", param, "invalid_value"


def install_handlers(app) -> None:
    """Every error the app can raise leaves in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return error_response(exc.status, exc.message, exc.param, exc.code, headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json" and any(
                tuple(e.get("loc", ())) == ("body",) and isinstance(e.get("input"), (str, bytes))
                and e.get("input") for e in exc.errors()):
            # FastAPI reads a body as JSON only when it says so: the body arrived as text
            return error_response(400, f"the request body must be JSON sent with "
                                       f"Content-Type: application/json (got "
                                       f"{kind or 'no Content-Type'})", None, "invalid_json")
        message, param, code = _validation_message(exc)
        return error_response(400, message, param, code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = "not found: " + request.url.path if exc.status_code == 404 else str(exc.detail)
        return error_response(exc.status_code, message, None,
                              "not_found" if exc.status_code == 404 else None)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        return error_response(500, f"internal error: {type(exc).__name__}", None,
                              "internal_error")
