"""The nightly library: request logs in, a signed release out (docs/precompute.md).

pipeline.py    the stages, in order: mine, generate, build, validate, publish, prune
results.py     what each stage returns (typed; its JSON passed on as XCom): Mined, Built, ...
config.py      the nightly job's settings and run options
mining.py      the hot questions (with logwindow.py: the window in DuckDB; dayparts.py: each
               log day reduced once, kept across nights, the days merged; reduction.py: one
               row per wording, kept there; textrules.py: the text rules once per distinct
               text; carry.py: the parent run's evidence; clustering.py (clusters.py:
               clusters as two flat arrays); kstep.py: rules
               6-8 per cluster, on processes; safetext.py: token-level k; asks.py: an ask's
               time; questions.py: a mined question and its wordings; spill.py: the
               questions found and the cluster report kept on local disk, read back ranked;
               nightcache.py and vectorcache.py: the verdicts and vectors kept across nights;
               clusterstate.py: the clusters carried from night to night, as stored;
               incremental.py: rule 5 with them, and NightCaches: what a night carries)
curated.py     the operator's answers
generate.py    answering the hot questions, partition by partition
fleet/         where the model stages run (Ray, local or a GPU fleet), and jobs.py: each
               stage of the DAG as a Ray Job
build.py       the release from the mined questions and their answers (with calibration.py:
               the semantic tier's decision; shards.py: the files written a part at a time;
               finetune.py: the embedder tuned on the release's phrasings, when asked)
publish.py     publishing: the release written where it is served, the flip of the signed pointer
prune.py       old and refused releases, and the answer objects no kept release holds
parent.py      what a run takes from the release it follows
revocations.py the signed revocation list and derived releases
releases.py    operating what is published: list, show, diff, rollback, renew
views.py       what list, show and diff say of releases: typed models holding the manifest's
               own (its Threshold...); their dumps are ``--json``
report.py      the HTML report of a release
workarea.py    the state between stages, in the store
samplelogs.py  sample request logs for the demo and the tests
"""
