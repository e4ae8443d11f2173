"""Serving a model over HTTP: the engine thread, the API's requests and responses, the routing
traces it keeps, the Starlette application, and the client a monitor (the Inspector) uses.

  * `worker`  - `EngineWorker`: one thread owns the `Session`, runs queued requests in arrival
                order through `Session.generate`'s loop, hot-reloads between requests and tokens.
  * `traces`  - `RequestTrace` (a request's routing trace, generic over the engine's `Trace`
                fields) and `TraceStore` (the bounded store), and their JSON.
  * `api`     - request bodies checked into `CompletionParams`; OpenAI-shaped responses.
  * `http`    - the Starlette application and uvicorn (the `serve` extra); imported only there.
  * `client`  - a blocking client of the API and `Monitor`, which follows a server's requests
                and rebuilds each one's `RoutingRecord` for the debugger's views.

Nothing here imports Qt.
"""
