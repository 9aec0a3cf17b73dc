"""The text rules: what must never be published, cached or logged. Pure functions of text (and
the bottom layer: they import nothing of ours), applied by the nightly job, the edge and the
origin alike.

    pii.py         personal data in a question
    timeliness.py  time-sensitive questions, whose answer changes with the time it is asked
    answers.py     degenerate answers: what generation produced that must never be served again
    redaction.py   what a request log keeps of a row: personal data never
    scripts.py     the writing system of a text (script_of), which routing and answers.py read
"""
