// The missed-hint: its form against the vectors the Python suite checks too, and the client
// sending it to the origin after a miss at the edge (never after a hit, never without a release).
// Run: node --test web/test/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { EdgeQAClient, MISSED_HEADER, missedHint } from "../edgeqa.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../tests/vectors/missed.json", import.meta.url), "utf8"));

test("every vector makes the same hint as in Python", () => {
  assert.ok(vectors.cases.length > 10);
  for (const c of vectors.cases) {
    assert.equal(missedHint(c.profile, c.version), c.hint, c.name);
  }
});

// An edge answering `edgeBody` with `edgeStatus` and an origin streaming "Hi."; the headers the
// origin received.
async function askThrough(edgeStatus, edgeBody) {
  const seen = {};
  const fetch = async (url, init = {}) => {
    if (url.startsWith("http://edge.test")) {
      return new Response(JSON.stringify(edgeBody), { status: edgeStatus });
    }
    seen.origin = init.headers;
    const sse = 'data: {"choices": [{"delta": {"content": "Hi."}}]}\n\ndata: [DONE]\n\n';
    return new Response(sse, { status: 200, headers: { "x-edgeqa-tier": "generated" } });
  };
  const client = new EdgeQAClient({ edge: "http://edge.test", origin: "http://origin.test",
                                    storage: null, fetch });
  const result = await client.ask("Why is the sky blue?");
  return { result, headers: seen.origin };
}

test("after a miss at the edge the origin is told which release missed", async () => {
  const miss = { miss: true, version: "20261130T050905Z-c3887d14", reason: "below_threshold",
                 profile: "bank-en" };
  const { result, headers } = await askThrough(404, miss);
  assert.equal(result.source, "origin");
  assert.equal(result.answer, "Hi.");
  assert.equal(headers[MISSED_HEADER], "bank-en/20261130T050905Z-c3887d14");
  // no release searched (nothing published), or a body that is not the edge's: no hint
  for (const body of [{ miss: true, version: null, reason: "no_release", profile: null },
                      { error: "not found" }]) {
    const other = await askThrough(404, body);
    assert.equal(other.result.source, "origin");
    assert.equal(other.headers[MISSED_HEADER], undefined, JSON.stringify(body));
  }
  // the edge failing says nothing about the release
  const failed = await askThrough(503, miss);
  assert.equal(failed.headers[MISSED_HEADER], undefined);
});
