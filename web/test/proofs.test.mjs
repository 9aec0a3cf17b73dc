// Signed pointers and answer-object proofs, against the vectors the Python suite checks too.
// Run: node --test web/test/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { EdgeQAClient, checkAnswerObject, pointerVerdict, signedRoot } from "../edgeqa.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../tests/vectors/proofs.json", import.meta.url), "utf8"));
const { profile, version, root } = vectors;

test("a pointer yields a root only when signed by a trusted key for this profile and version",
  async () => {
    assert.ok(vectors.pointers.length >= 8);
    for (const c of vectors.pointers) {
      const found = await signedRoot(c.pointer, { profile, publicKeys: vectors.public_keys });
      assert.equal(found, c.root, c.name);
    }
    const signed = vectors.pointers[0].pointer;
    assert.equal(await signedRoot(signed, { profile, publicKeys: [] }), null);
    assert.equal(await signedRoot(signed, { profile, publicKeys: ["not a key"] }), null);
  });

test("a client reads the CDN only under a fresh pointer no older than one it saw", async () => {
  assert.ok(vectors.pointers.length >= 20);
  const nowMs = vectors.now_s * 1000;
  for (const c of vectors.pointers) {
    const newest = c.newest && { sequence: c.newest.sequence,
                                 manifestSha256: c.newest.manifest_sha256 };
    const { signed, problem } = await pointerVerdict(
      c.pointer, { profile, publicKeys: vectors.public_keys, newest, nowMs });
    assert.equal(problem, c.problem, c.name);
    assert.equal(signed?.root ?? null, c.root, c.name);
  }
});

test("an answer object is shown only when it proves itself against the signed root", async () => {
  assert.ok(vectors.objects.length >= 12);
  const nowMs = vectors.now_s * 1000;
  for (const c of vectors.objects) {
    const problem = await checkAnswerObject(c.object, { key: c.key, profile, version, root, nowMs });
    assert.equal(problem, c.problem, c.name);
  }
});

test("the pointer is asked for again each time, never taken from the browser's cache", async () => {
  const asked = [];
  const fetch = async (url, init = {}) => {
    asked.push({ url, cache: init.cache });
    return new Response(JSON.stringify(vectors.pointers[0].pointer), { status: 200 });
  };
  const client = new EdgeQAClient({ cdn: "http://cdn.test", profile, storage: null, fetch,
                                    releasePublicKeys: vectors.public_keys, pointerTtlMs: 0 });
  await client.currentRelease();
  await client.currentRelease();
  assert.deepEqual(asked, [
    { url: `http://cdn.test/${profile}/current.json`, cache: "no-cache" },
    { url: `http://cdn.test/${profile}/current.json`, cache: "no-cache" },
  ]);
});
