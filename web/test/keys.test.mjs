// The key spec in JavaScript against the vectors the Python suite checks too.
// Run: node --test web/test/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { InvalidQueryError, key, normalize } from "../edgeqa.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../tests/vectors/keys.json", import.meta.url), "utf8"));

test("every vector normalizes and hashes as in Python", async () => {
  assert.ok(vectors.vectors.length > 20);
  for (const v of vectors.vectors) {
    assert.equal(normalize(v.input, vectors.max_query_chars), v.normalized, v.name);
    assert.equal(await key(v.input, vectors.max_query_chars), v.key, v.name);
  }
});

test("every invalid input is refused with the same reason", () => {
  assert.ok(vectors.invalid.length > 2);
  for (const v of vectors.invalid) {
    assert.throws(() => normalize(v.input, vectors.max_query_chars),
      (error) => error instanceof InvalidQueryError && error.reason === v.error, v.name);
  }
});
