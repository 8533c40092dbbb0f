"""JSON-RPC error codes used on the wire (standard ones plus our application set)."""

from enum import IntEnum


class ErrorCode(IntEnum):
    """Every error code a peer can receive.

    The standard JSON-RPC 2.0 codes, the LSP request-cancelled code, and a
    small application range (-32001..-32099) whose meaning is fixed here.
    """

    PARSE_ERROR = -32700
    """The line is not valid JSON (the reply has ``id: null``)."""
    INVALID_REQUEST = -32600
    """Valid JSON but not a JSON-RPC 2.0 request (missing method, bad version, empty batch)."""
    METHOD_NOT_FOUND = -32601
    """No such method."""
    INVALID_PARAMS = -32602
    """Params of the wrong shape; the message names the offending field."""
    INTERNAL_ERROR = -32603
    """A bug on our side; details go to the log, never a traceback on the wire."""
    REQUEST_CANCELLED = -32800
    """The request was cancelled by ``$/cancelRequest`` (LSP convention)."""
    NOT_FOUND = -32001
    """A session, message, provider or tool call id that does not exist."""
    BUSY = -32002
    """The resource is busy (for example the server is shutting down)."""
    BAD_STATE = -32003
    """The request is valid but not allowed in the current state."""
    PROVIDER_ERROR = -32004
    """An LLM provider or agent engine failed."""
    NOT_IMPLEMENTED = -32005
    """The method is part of the contract but not implemented yet."""
    MESSAGE_TOO_LARGE = -32006
    """The input line exceeded the size limit; it was discarded unread."""
    STORE_ERROR = -32007
    """The database failed (disk full, corrupted file); nothing was changed."""
    SECRETS_LOCKED = -32008
    """A stored secret (API key, token) was sealed with a key this process was not given
    (another host key): calls that need it fail; nothing is lost."""
    RESPONSE_TOO_LARGE = -32009
    """A request of a batch was answered, but its answer did not fit in the batch's answer
    (``MAX_BATCH_ANSWER_BYTES``): send it alone."""
    FEATURE_UNAVAILABLE = -32010
    """The request needs an optional part of the bundle that is not installed (``data``:
    ``{part, module}``, e.g. ``vectors`` for embedding models); everything else works."""
