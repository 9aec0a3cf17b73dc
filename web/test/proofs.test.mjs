// Signed pointers, the key index's buckets and the answer objects they name, against the vectors
// the Python suite checks too; the client's exact tier reading them from a CDN.
// Run: node --test web/test/
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  EdgeQAClient, answerObjectProblem, bucketEntry, bucketOf, bucketPath, bucketProblem, key,
  objectPath, pointerVerdict, signedRoot,
} from "../edgeqa.js";

const vectors = JSON.parse(
  readFileSync(new URL("../../tests/vectors/proofs.json", import.meta.url), "utf8"));
const { profile, version, root } = vectors;
const nowMs = vectors.now_s * 1000;
const EDGE_ANSWER = "the edge's answer";

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
  for (const c of vectors.pointers) {
    const newest = c.newest && { sequence: c.newest.sequence,
                                 manifestSha256: c.newest.manifest_sha256 };
    const { signed, problem } = await pointerVerdict(
      c.pointer, { profile, publicKeys: vectors.public_keys, newest, nowMs });
    assert.equal(problem, c.problem, c.name);
    assert.equal(signed?.root ?? null, c.root, c.name);
  }
});

test("a bucket is read only when it is the one asked for and proves itself", async () => {
  assert.ok(vectors.buckets.length >= 20);
  for (const c of vectors.buckets) {
    const problem = await bucketProblem(c.file, { bucket: c.bucket, profile, version, root });
    assert.equal(problem, c.problem, c.name);
  }
});

test("a bucket names a key's object only on the key's own line", () => {
  assert.ok(vectors.entries.length >= 10);
  for (const c of vectors.entries) {
    assert.equal(bucketEntry({ entries: c.entries }, c.key), c.sha256, c.name);
  }
});

// The vectors' CDN, a path to its bytes, with `changes` made (null: the file removed).
function cdnFiles(changes) {
  const files = new Map(Object.entries({ ...vectors.files, ...changes }));
  for (const [path, text] of Object.entries(changes)) if (text === null) files.delete(path);
  return new Map([...files].map(([path, text]) => [path, new TextEncoder().encode(text)]));
}

// What the rule concludes for key `k` reading `files`: [stage, problem, answer].
async function lookUp(files, k) {
  const bucket = bucketOf(k);
  const data = files.get(`${profile}/releases/${version}/${bucketPath(bucket)}`);
  if (!data) return ["bucket", "missing", null];
  let found;
  try { found = JSON.parse(new TextDecoder().decode(data)); } catch {
    return ["bucket", "malformed", null];
  }
  const problem = await bucketProblem(found, { bucket, profile, version, root });
  if (problem !== null) return ["bucket", problem, null];
  const sha256 = bucketEntry(found, k);
  if (sha256 === null) return ["entry", "unlisted", null];
  const object = files.get(`${profile}/${objectPath(sha256)}`);
  if (!object) return ["object", "missing", null];
  const why = await answerObjectProblem(object, { key: k, profile, sha256, nowMs });
  if (why !== null) return ["object", why, null];
  return [null, null, JSON.parse(new TextDecoder().decode(object)).answer];
}

test("an answer is shown only through a proved bucket and its object's digest", async () => {
  assert.ok(vectors.lookups.length >= 15);
  for (const c of vectors.lookups) {
    assert.equal(await key(c.question), c.key, c.name);
    assert.deepEqual(await lookUp(cdnFiles(c.changes), c.key), [c.stage, c.problem, c.answer],
                     c.name);
  }
});

// A client of the vectors' CDN (with `changes`) and an edge answering EDGE_ANSWER, at the
// vectors' time; `asked`: the CDN paths it fetched.
function clientOf(changes = {}) {
  const files = cdnFiles(changes);
  const asked = [];
  const fetch = async (url) => {
    if (url.startsWith("http://edge.test/")) {
      return new Response(JSON.stringify({ answer: EDGE_ANSWER, tier: "exact" }));
    }
    const path = url.slice("http://cdn.test/".length);
    asked.push(path);
    const data = files.get(path);
    return data ? new Response(data) : new Response("not found", { status: 404 });
  };
  const client = new EdgeQAClient({ cdn: "http://cdn.test", edge: "http://edge.test", profile,
                                    storage: null, fetch, releasePublicKeys: vectors.public_keys,
                                    origin: "http://origin.test" });
  return { client, asked };
}

async function atVectorsTime(run) {
  const realNow = Date.now;
  Date.now = () => nowMs;
  try { return await run(); } finally { Date.now = realNow; }
}

test("the client shows the CDN's answer only where the rule does, else asks the edge",
  async () => {
    await atVectorsTime(async () => {
      for (const c of vectors.lookups) {
        const { client } = clientOf(c.changes);
        const result = await client.ask(c.question);
        assert.equal(result.key, c.key, c.name);
        if (c.answer !== null) {
          assert.deepEqual([result.tier, result.source, result.answer],
                           ["exact", "cdn", c.answer], c.name);
        } else {
          assert.deepEqual([result.source, result.answer], ["edge", EDGE_ANSWER], c.name);
        }
      }
    });
  });

test("a bucket that proved itself is fetched once for every question it holds", async () => {
  await atVectorsTime(async () => {
    const shared = vectors.lookups.filter((c) => c.answer !== null)
      .filter((c, _, all) => all.filter((o) => bucketOf(o.key) === bucketOf(c.key)).length > 1);
    assert.equal(shared.length, 2);
    const { client, asked } = clientOf();
    const bucketFile = `${profile}/releases/${version}/${bucketPath(bucketOf(shared[0].key))}`;
    for (const c of [...shared, ...shared]) {
      assert.equal((await client.ask(c.question)).answer, c.answer, c.name);
    }
    assert.equal(asked.filter((path) => path === bucketFile).length, 1, asked.join("\n"));
    assert.equal(asked.filter((path) => path.startsWith(`${profile}/a/`)).length, 4);
    // a refused bucket is not kept: asked again, it is fetched again (and refused again)
    const forged = clientOf({ [bucketFile]: "{" });
    for (const c of shared) assert.equal((await forged.client.ask(c.question)).source, "edge");
    assert.equal(forged.asked.filter((path) => path === bucketFile).length, 2);
  });
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
