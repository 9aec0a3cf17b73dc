// The rule for showing a CDN answer object, against the vectors the Python suite checks too.
// Run: node --test web/test/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { answerObjectProblem } from "../edgeqa.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../tests/vectors/answer_objects.json", import.meta.url), "utf8"));

test("an answer object is shown only when its bytes are the digest asked for, its key's, fresh",
  async () => {
    assert.ok(vectors.cases.length > 20);
    const { key, profile } = vectors;
    const nowMs = vectors.now_s * 1000;
    for (const c of vectors.cases) {
      const bytes = "hex" in c ? Uint8Array.from(Buffer.from(c.hex, "hex"))
                               : new TextEncoder().encode(c.text);
      const options = { key, profile, sha256: c.sha256, nowMs };
      assert.equal(await answerObjectProblem(bytes, options), c.problem, c.name);
      // as response.arrayBuffer() gives them
      assert.equal(await answerObjectProblem(bytes.slice().buffer, options), c.problem, c.name);
    }
  });
