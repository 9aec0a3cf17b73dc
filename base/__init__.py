"""The shared base every part of edgeqa imports: the contracts between the nightly job, the edge,
the origin and the clients, and the platform they stand on. It imports nothing of ours but the
text rules (``policy/``).

    keys.py            the key spec: a question's normalized form and the key naming its answer
    missed.py          the missed-hint: the release a client has just missed in at the edge
    languages.py       which language profile a question belongs to (mirrored in web/edgeqa.js)
    errors.py          the one base of every error users read (EdgeQAError)
    config.py          the settings root: every shared EDGEQA_* variable, read once
    store.py           one store over local folders (file://) and S3 (s3://), opened by URI
    store_base.py      the store interface, its errors and retries, bulk transfers' worker pool
    s3store.py         S3: conditional writes, a pool sized to requests in flight, batch deletes
    logs.py            request logs: Parquet batches under <store>/logs/dt=YYYY-MM-DD/
    logreader.py       request logs read back, a window of days file by file
    spill.py           the local folder logs wait in while the store refuses them
    users.py           who asked: an asker's network, salted user hashes, signed user tokens
    asn.py             autonomous systems of viewers, from a local table (the crowd rule)
    bodies.py          JSON request bodies parsed into values the services can use
    credentials.py     bearer tokens compared in constant time
    manifest.py        the release manifest as one typed model (docs/release-format.md)
    release.py         the release format: reading and verifying a published release
    release_check.py   a release checked whole where it is served, before it is pointed to
    answer_objects.py  the exact tier: objects by content, the key index, the clients' rule
    signing.py         release signatures: who may publish what is served
    pointers.py        the signed pointer (current.json): which release, in what order, until when
    highwater.py       the highest sequences ever signed, outside the store (a rollback's floor)
    proofs.py          Merkle proofs of a key-index bucket against a release's signature
"""
