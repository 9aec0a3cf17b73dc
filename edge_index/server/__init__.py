"""The edge index service, a deployable beside ``origin/server/``: published answers in
milliseconds (``edgeqa edge serve``).

    app.py  the ASGI app: /v1/lookup (GET and POST), /health, /metrics; ``serve``
"""
