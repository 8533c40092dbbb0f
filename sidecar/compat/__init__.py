"""The V1 ``/computer/chat`` endpoint: the old agent-runner HTTP API, served by the ChatEngine.

    service.py    compat:start / stop / status; the endpoint's lifetime (uvicorn in our loop)
    http.py       ASGI: routes, API key, body limits, the SSE stream (imported on start only)
    endpoint.py   what each route does
    projects.py   V1 project -> local session and provider (ACP engine or direct)
    turns.py      a V1 prompt as chat:send; its chat:stream events -> progress frames; rules
    frames.py     the V1 SSE frames, per flavor (electron / rcoder)
    progress.py   progress streams per session: clients, the early-event buffer
    rules.py      tool_approval_rules matching
    validate.py   ids, working directories, the API key
    wire.py       V1 request / response bodies and the HttpResult envelope

README "V1 /computer/chat" is the user-facing description of the contract and its rules.
"""
