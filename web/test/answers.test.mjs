// The rule for showing a CDN answer object, against the vectors the Python suite checks too.
// Run: node --test web/test/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { answerObjectProblem } from "../edgeqa.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../tests/vectors/answer_objects.json", import.meta.url), "utf8"));

test("an answer object is shown only when it is the one asked for and not expired", () => {
  assert.ok(vectors.cases.length > 10);
  const { key, profile, version } = vectors;
  const nowMs = vectors.now_s * 1000;
  for (const c of vectors.cases) {
    const problem = answerObjectProblem(c.object, { key, profile, version, nowMs });
    assert.equal(problem, c.problem, c.name);
  }
});
