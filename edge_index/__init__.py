"""The edge index: answering from a published release in milliseconds.

server/           the edge index service (Starlette): POST /v1/lookup, /health, /metrics
releases.py       the releases a service answers from: one watcher per language, a question routed
watcher.py        one profile's served release: polled, verified, swapped in, revoked, its health
release_metrics.py  the served releases' metrics, one registry per service
profiles.py       which release profile serves a language, and the embedder it is read with
lookup.py         lookups in one loaded release: the exact key map, then FAISS
explain.py        why a lookup ends as it does (``edgeqa release explain``), as typed models
tiers.py          the tier cascade, defined once for every service that answers from a release

The semantic model these use (the embedder, its encoding, the matcher and the guard) is the floor
below: ``semantic/``.
"""
