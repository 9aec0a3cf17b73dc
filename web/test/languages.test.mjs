// The language rule in JavaScript against the vectors the Python suite checks too.
// Run: node --test web/test/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { languageOf } from "../edgeqa.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../tests/vectors/languages.json", import.meta.url), "utf8"));

test("every vector is routed to the same language profile as in Python", () => {
  assert.ok(vectors.vectors.length > 15);
  for (const v of vectors.vectors) {
    assert.equal(languageOf(v.text), v.language, JSON.stringify(v.text));
  }
});
