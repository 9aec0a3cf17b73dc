// edgeqa web client: the key spec and the tiered lookup, as a dependency-free ES module.
//
// Key spec (docs/key-spec.md; the same steps as base/keys.py, checked against
// tests/vectors/keys.json by web/test/keys.test.mjs):
//   normalize(q) = NFKC -> lower-case -> each whitespace run becomes one space -> strip ->
//                  strip a trailing run of ? ! . 。 ？ ！ … ~ with the spaces around it
//   key(q)       = hex(SHA-256(UTF-8(normalize(q))))            (WebCrypto)
//
// Tiered lookup (EdgeQAClient.ask):
//   1. exact  — <cdn>/<profile>/current.json (cached) -> the key index's bucket
//               <cdn>/<profile>/releases/<v>/k/<key[:3]>.json (kept in memory) -> the answer
//               object it names, by its content: <cdn>/<profile>/a/<sha[:2]>/<sha>.json. Shown
//               only when the pointer's statement is signed by one of releasePublicKeys, fresh
//               and not older than one seen before (remembered in localStorage), the bucket's
//               Merkle proof leads to the root it names, and the object's bytes hash to the
//               sha256 the bucket lists for the key (docs/release-format.md, docs/security.md)
//   2. edge   — POST <edge>/v1/lookup {"q"}  (exact or semantic, FAISS + calibrated decision)
//   3. origin — POST <origin>/v1/chat/completions, streamed (SSE); the origin may still answer
//               from its own tiers (x-edgeqa-tier: exact | semantic | origin_cache | generated);
//               after a miss at the edge, with x-edgeqa-missed: <profile>/<version> (the edge's
//               miss body's), so the origin does not search that release again (missedHint)
// and reports which tier answered and the time to the first byte of the answer.

export const MAX_QUERY_CHARS = 2048;

// Language profiles (base/languages.py; tests/vectors/languages.json): a question is
// looked up under its language's release profile: "zh" when CJK letters (Han, kana, hangul) are
// at least as many as all its other letters, else "en". Letters as Python's [^\W\d_].
const LETTER = /[\p{L}\p{Nl}\p{No}]/gu;
const isCjk = (c) => (c >= 0x3040 && c < 0xa000) || (c >= 0xac00 && c < 0xd7b0) ||
  (c >= 0xf900 && c < 0xfb00) || (c >= 0x20000 && c < 0x32000);

export function languageOf(text) {
  let cjk = 0;
  let other = 0;
  for (const letter of String(text).match(LETTER) ?? []) {
    if (isCjk(letter.codePointAt(0))) cjk += 1;
    else other += 1;
  }
  return cjk > 0 && cjk >= other ? "zh" : "en";
}

// The Unicode White_Space property, spelled out (JavaScript's \s also matches U+FEFF).
const WHITESPACE =
  "\u0009\u000a\u000b\u000c\u000d\u0020\u0085\u00a0\u1680" +
  "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" +
  "\u2028\u2029\u202f\u205f\u3000";
const TRAILING = " ?!.\u3002\uff1f\uff01\u2026~";
const WHITESPACE_RUN = new RegExp(`[${WHITESPACE}]+`, "gu");
const LONE_SURROGATE = /\p{Cs}/u; // with the u flag a paired surrogate is one code point

export class InvalidQueryError extends Error {
  constructor(message, reason = "invalid") {
    super(message);
    this.name = "InvalidQueryError";
    this.reason = reason; // "invalid" | "empty" | "too_long"
  }
}

export function normalize(query, maxQueryChars = MAX_QUERY_CHARS) {
  if (typeof query !== "string") {
    throw new InvalidQueryError(`q must be a string, got ${typeof query}`);
  }
  if (LONE_SURROGATE.test(query)) {
    throw new InvalidQueryError("q contains a lone surrogate: it is not valid Unicode");
  }
  let text = query.normalize("NFKC");
  const length = [...text].length; // code points, as Python's len()
  if (length > maxQueryChars) {
    throw new InvalidQueryError(
      `q is ${length} characters after NFKC; the limit is ${maxQueryChars}`, "too_long");
  }
  text = text.toLowerCase().replace(WHITESPACE_RUN, " ");
  let start = 0;
  let end = text.length;
  while (start < end && text[start] === " ") start += 1;
  while (end > start && TRAILING.includes(text[end - 1])) end -= 1;
  text = text.slice(start, end);
  if (!text) throw new InvalidQueryError("q is empty after normalization", "empty");
  return text;
}

export const MISSED_HEADER = "x-edgeqa-missed";
const MISSED = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\/[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;

// The x-edgeqa-missed value for an edge miss in `profile`'s `version` (its 404 body's fields), or
// null when they do not make one: both must be plain names of at most 128 characters
// (base/missed.py missed_hint, on tests/vectors/missed.json).
export function missedHint(profile, version) {
  if (typeof profile !== "string" || typeof version !== "string") return null;
  const hint = `${profile}/${version}`;
  return MISSED.test(hint) ? hint : null;
}

export async function keyOfNormalized(normalized) {
  const digest = await globalThis.crypto.subtle.digest(
    "SHA-256", new TextEncoder().encode(normalized));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

export async function key(query, maxQueryChars = MAX_QUERY_CHARS) {
  return keyOfNormalized(normalize(query, maxQueryChars));
}

const now = () => globalThis.performance.now();

const HEX_STEP = /^[lr][0-9a-f]{64}$/;
const MAX_PROOF_STEPS = 64;
const STATEMENT_FORMAT = "edgeqa-release-statement/1";

const digest = async (bytes) => new Uint8Array(await globalThis.crypto.subtle.digest("SHA-256", bytes));
const fromHex = (hex) => Uint8Array.from(hex.match(/../g), (b) => parseInt(b, 16));
const toHex = (bytes) => [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
const concat = (...parts) => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) { out.set(part, at); at += part.length; }
  return out;
};
const fromBase64 = (text) => {
  if (typeof text !== "string" || !/^[A-Za-z0-9+/]*={0,2}$/.test(text)) throw new Error("base64");
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
};

// The key index and the answer objects (base/answer_objects.py, on
// tests/vectors/proofs.json and answer_objects.json): a bucket per KEY_DIGITS hex digits of the
// key, `<key> <sha256>` lines proved to the signed answers root; an object named by its bytes.
export const KEY_DIGITS = 3;
const BUCKET_FIELDS = ["profile", "version", "bucket", "entries"]; // its leaf's, in this order
const HEX64 = /^[0-9a-f]{64}$/;
const ENTRY = /^([0-9a-f]{64}) ([0-9a-f]{64})/;

export const bucketOf = (key) => key.slice(0, KEY_DIGITS);
// Where a bucket lives under <profile>/releases/<version>/, and an object under <profile>/.
export const bucketPath = (bucket) => `k/${bucket}.json`;
export const objectPath = (sha256) => `a/${sha256.slice(0, 2)}/${sha256}.json`;

// The leaf of `fields` (strings): SHA-256(0x00 || SHA-256(field 1) || ...), each field UTF-8.
async function leaf(fields) {
  const encoder = new TextEncoder();
  const digests = await Promise.all(fields.map((f) => digest(encoder.encode(f))));
  return digest(concat(new Uint8Array([0]), ...digests));
}

// The root (hex) `proof` leads `leafHash` to, or null when the proof is malformed (steps
// "l<hex>" / "r<hex>" from the leaf up, at most MAX_PROOF_STEPS).
async function proofRoot(leafHash, proof) {
  if (!Array.isArray(proof) || proof.length > MAX_PROOF_STEPS) return null;
  let node = leafHash;
  for (const step of proof) {
    if (typeof step !== "string" || !HEX_STEP.test(step)) return null;
    const sibling = fromHex(step.slice(1));
    node = await digest(step[0] === "l" ? concat(new Uint8Array([1]), sibling, node)
                                        : concat(new Uint8Array([1]), node, sibling));
  }
  return toHex(node);
}

// Why a bucket fetched from the CDN (parsed) must not be read as `bucket` of `profile`'s
// `version` ("malformed", "bucket", "profile", "version", "proof"), or null when its proof leads
// to the signed `root` (base/answer_objects.py bucket_problem).
export async function bucketProblem(object, { bucket, profile, version, root }) {
  if (!object || typeof object !== "object" ||
      !BUCKET_FIELDS.every((n) => typeof object[n] === "string")) {
    return "malformed";
  }
  for (const [name, expected] of [["bucket", bucket], ["profile", profile], ["version", version]]) {
    if (object[name] !== expected) return name;
  }
  if (LONE_SURROGATE.test(object.entries)) return "malformed"; // not UTF-8: no leaf of it
  if (typeof root !== "string") return "proof";
  const found = await leaf(BUCKET_FIELDS.map((n) => object[n]));
  return (await proofRoot(found, object.proof)) === root ? null : "proof";
}

// The sha256 of `key`'s object in a checked bucket, or null when the bucket lists none (its
// own line only: "<key> <sha256>") (base/answer_objects.py bucket_entry).
export function bucketEntry(object, key) {
  const entries = object.entries;
  let at = typeof key === "string" && HEX64.test(key) ? entries.indexOf(`${key} `) : -1;
  while (at > 0 && entries[at - 1] !== "\n") at = entries.indexOf(`${key} `, at + 1);
  if (at < 0) return null;
  return ENTRY.exec(entries.slice(at, at + 129))?.[2] ?? null;
}

// Why an answer object fetched for `key` (`data`: its bytes, an ArrayBuffer or Uint8Array, as
// the CDN sent them; `sha256`: the digest its checked bucket lists) must not be shown
// ("digest", "malformed", "key", "profile", "expired"), or null when it may
// (base/answer_objects.py answer_object_problem).
export async function answerObjectProblem(data, { key, profile, sha256, nowMs = Date.now() }) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  if (toHex(await digest(bytes)) !== sha256) return "digest";
  let object;
  try {
    object = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch {
    return "malformed";
  }
  if (!object || typeof object !== "object" || typeof object.answer !== "string") {
    return "malformed";
  }
  for (const [name, expected] of [["key", key], ["profile", profile]]) {
    if (object[name] !== expected) return name;
  }
  const expires = typeof object.expires_at === "string" &&
    /(Z|[+-]\d\d:\d\d)$/.test(object.expires_at) ? Date.parse(object.expires_at) : NaN;
  if (Number.isNaN(expires)) return "malformed";
  return expires <= nowMs ? "expired" : null;
}

const MAX_BUCKETS = 64; // buckets kept by a client (~30 KB each at a million keys)
const POINTER_FORMAT = "edgeqa-pointer/1";
const MAX_SEQUENCE = Number.MAX_SAFE_INTEGER;

// What `pointer` (a parsed current.json) says once its `signed` statement verifies under one of
// `publicKeys` (base64 raw Ed25519) for this profile and the release the pointer names:
// { version, manifestSha256, root, sequence, notAfterMs }, or null (base/pointers.py
// verify_pointer, on tests/vectors/proofs.json). A statement signed before pointers carried a
// sequence (a release's own) reads as sequence 0 with no expiry.
export async function signedPointer(pointer, { profile, publicKeys }) {
  const signed = pointer?.signed;
  if (!signed || typeof signed !== "object" || signed.alg !== "ed25519" ||
      typeof signed.statement !== "string") {
    return null;
  }
  let signature;
  try { signature = fromBase64(signed.signature); } catch { return null; }
  if (signature.length !== 64) return null;
  const text = new TextEncoder().encode(signed.statement);
  for (const publicKey of publicKeys) {
    let verified = false;
    try {
      const key = await globalThis.crypto.subtle.importKey(
        "raw", fromBase64(publicKey), { name: "Ed25519" }, false, ["verify"]);
      verified = await globalThis.crypto.subtle.verify({ name: "Ed25519" }, key, signature, text);
    } catch { /* a malformed key verifies nothing */ }
    if (!verified) continue;
    let statement;
    try { statement = JSON.parse(signed.statement); } catch { return null; }
    if (![STATEMENT_FORMAT, POINTER_FORMAT].includes(statement?.format) ||
        statement.profile !== profile || statement.version !== pointer.version ||
        statement.manifest_sha256 !== pointer.manifest_sha256 ||
        typeof statement.answers_root !== "string" || typeof pointer.version !== "string" ||
        typeof pointer.manifest_sha256 !== "string") {
      return null;
    }
    let sequence = 0;
    let notAfterMs = null;
    if (statement.format === POINTER_FORMAT) {
      sequence = statement.sequence;
      if (!Number.isSafeInteger(sequence) || sequence < 1 || sequence > MAX_SEQUENCE) return null;
      // an ISO 8601 time with a zone (as Python's fromisoformat reads it)
      if (typeof statement.not_after !== "string" ||
          !/(Z|[+-]\d\d:\d\d)$/.test(statement.not_after)) return null;
      notAfterMs = Date.parse(statement.not_after);
      if (Number.isNaN(notAfterMs)) return null;
    }
    return { version: pointer.version, manifestSha256: pointer.manifest_sha256,
             root: statement.answers_root, sequence, notAfterMs };
  }
  return null;
}

// The answers root `pointer` proves, or null (base/pointers.py signed_root).
export async function signedRoot(pointer, options) {
  return (await signedPointer(pointer, options))?.root ?? null;
}

// What a client concludes of `pointer`, given the newest { sequence, manifestSha256 } it verified
// before: { signed, problem }, problem null when answer objects may be read under it, else
// "unsigned", "rollback" (older than `newest`) or "stale" (expired, or never given an expiry)
// (base/pointers.py client_verdict, on tests/vectors/proofs.json).
export async function pointerVerdict(pointer, { profile, publicKeys, newest = null,
                                                nowMs = Date.now() }) {
  const signed = await signedPointer(pointer, { profile, publicKeys });
  if (signed === null) return { signed, problem: "unsigned" };
  if (newest && (signed.sequence < newest.sequence || (signed.sequence === newest.sequence &&
      signed.manifestSha256 !== newest.manifestSha256))) {
    return { signed, problem: "rollback" };
  }
  if (signed.notAfterMs === null || nowMs > signed.notAfterMs) return { signed, problem: "stale" };
  return { signed, problem: null };
}

export class EdgeQAClient {
  // cdn: base URL of the release store (CloudFront); profiles: the release profile of each
  // language (/config.json's), a question's chosen by languageOf; profile: one profile for
  // every question instead; edge: the edge index service; origin: the origin server. Any of
  // cdn/edge may be empty.
  // userToken: the signed user token your backend minted (docs/security.md#identity), if any.
  // releasePublicKeys: the keys releases are signed with (EDGEQA_RELEASE_PUBLIC_KEYS, base64);
  // without them the CDN tier is skipped: an answer object is shown only when the bucket naming
  // it proves itself against a signed root.
  // storage: where the newest pointer verified is remembered across page loads (localStorage by
  // default; null: this client's lifetime only), so an older one put back is refused.
  constructor({ cdn = "", profile = "", profiles = {}, edge = "", origin = "", model = "",
                apiKey = "", userToken = "", releasePublicKeys = [], pointerTtlMs = 30000,
                storage = globalThis.localStorage ?? null,
                fetch = globalThis.fetch.bind(globalThis) } = {}) {
    Object.assign(this, { cdn, profile, profiles, edge, origin, model, apiKey, userToken,
                          pointerTtlMs, storage });
    this.releasePublicKeys = releasePublicKeys;
    this.fetch = fetch;
    this.pointers = new Map(); // profile -> { release: { version, root } | null, at }
    this.newest = new Map(); // profile -> { sequence, manifestSha256 } (without storage)
    // profile -> why its CDN pointer was last refused: "unsigned", "rollback" or "stale"
    this.pointerProblems = new Map();
    // [profile, version, bucket, root] -> a bucket of the key index that proved itself
    this.buckets = new Map();
  }

  #newestKey(profile) { return `edgeqa.pointer:${this.cdn}/${profile}`; }

  // The newest pointer verified for `profile` ({ sequence, manifestSha256 }), or null.
  newestPointer(profile) {
    try {
      const stored = this.storage?.getItem(this.#newestKey(profile));
      if (stored) {
        const found = JSON.parse(stored);
        if (Number.isSafeInteger(found?.sequence) && typeof found.manifestSha256 === "string") {
          return found;
        }
      }
    } catch { /* storage refused (private mode): memory only */ }
    return this.newest.get(profile) ?? null;
  }

  #remember(profile, signed) {
    const newest = { sequence: signed.sequence, manifestSha256: signed.manifestSha256 };
    this.newest.set(profile, newest);
    try {
      this.storage?.setItem(this.#newestKey(profile), JSON.stringify(newest));
    } catch { /* storage refused: memory only */ }
  }

  // The profile `question` is looked up under ("" when none is known).
  profileFor(question) {
    return this.profile || this.profiles?.[languageOf(question)] || "";
  }

  userHeaders() {
    return this.userToken ? { "x-edgeqa-user": this.userToken } : {};
  }

  // The current release, { version, root }, when its pointer is signed by a trusted key, fresh
  // and not older than one verified before; null when there is none, it is refused
  // (pointerProblems says why), or the CDN is down (the other tiers still answer).
  async currentRelease(profile = this.profile) {
    if (!this.cdn || !profile || !this.releasePublicKeys.length) return null;
    const cached = this.pointers.get(profile);
    if (cached && now() - cached.at < this.pointerTtlMs) return cached.release;
    let release = null;
    try {
      // asked again each time (a conditional GET): a pointer the browser cached by heuristic
      // would hide a revocation or a rollback; pointerTtlMs spaces the asks
      const response = await this.fetch(`${this.cdn}/${profile}/current.json`,
                                        { cache: "no-cache" });
      if (response.ok) {
        const pointer = await response.json();
        const { signed, problem } = await pointerVerdict(pointer, {
          profile, publicKeys: this.releasePublicKeys, newest: this.newestPointer(profile) });
        if (problem === null) {
          this.#remember(profile, signed);
          this.pointerProblems.delete(profile);
          release = { version: signed.version, root: signed.root };
        } else {
          if (this.pointerProblems.get(profile) !== problem) {
            console.warn(`edgeqa: the CDN's pointer of ${profile} is refused (${problem}); ` +
                         "asking the edge and the origin instead");
          }
          this.pointerProblems.set(profile, problem);
        }
      }
    } catch {
      return null;
    }
    this.pointers.set(profile, { release, at: now() });
    return release;
  }

  // Bucket `bucket` of `profile`'s `release` ({ version, root }) once it proves itself to the
  // root, or null (missing, or refused: the next tiers answer). A release's buckets never change:
  // the last MAX_BUCKETS read are kept, so a second question in one costs no fetch.
  async bucket(profile, release, bucket, { signal } = {}) {
    const { version, root } = release;
    const id = JSON.stringify([profile, version, bucket, root]);
    const kept = this.buckets.get(id);
    if (kept) {
      this.buckets.delete(id); // the most recently used last
      this.buckets.set(id, kept);
      return kept;
    }
    const url = `${this.cdn}/${profile}/releases/${version}/${bucketPath(bucket)}`;
    const response = await this.fetch(url, { signal });
    if (!response.ok) return null;
    let found;
    try { found = await response.json(); } catch { return null; }
    if (await bucketProblem(found, { bucket, profile, version, root }) !== null) return null;
    this.buckets.set(id, found);
    while (this.buckets.size > MAX_BUCKETS) this.buckets.delete(this.buckets.keys().next().value);
    return found;
  }

  // The CDN's answer for key `k` under `release`: its bucket proves itself, lists `k`, and the
  // object's bytes hash to the sha256 listed (fresh, for `k` and `profile`):
  // { answer, firstByte }, or null.
  async exactAnswer(profile, release, k, { signal } = {}) {
    const bucket = await this.bucket(profile, release, bucketOf(k), { signal });
    const sha256 = bucket && bucketEntry(bucket, k);
    if (!sha256) return null;
    const response = await this.fetch(`${this.cdn}/${profile}/${objectPath(sha256)}`, { signal });
    if (!response.ok) return null;
    const firstByte = now();
    const data = new Uint8Array(await response.arrayBuffer()); // hashed as sent, then parsed
    if (await answerObjectProblem(data, { key: k, profile, sha256 }) !== null) return null;
    return { answer: JSON.parse(new TextDecoder().decode(data)).answer, firstByte };
  }

  // Answer `question`: { tier, source, answer, ttfbMs, totalMs, key }. onText(delta) receives
  // the answer as it arrives (once for a cached answer, per chunk for a generated one).
  async ask(question, { onText = () => {}, signal, maxTokens } = {}) {
    const started = now();
    const normalized = normalize(question);
    const k = await keyOfNormalized(normalized);
    const done = (tier, source, answer, firstByte) => {
      const result = { tier, source, answer, key: k,
                       ttfbMs: firstByte - started, totalMs: now() - started };
      return result;
    };

    const profile = this.profileFor(question);
    const release = await this.currentRelease(profile);
    if (release) {
      try {
        const found = await this.exactAnswer(profile, release, k, { signal });
        if (found !== null) {
          onText(found.answer);
          return done("exact", "cdn", found.answer, found.firstByte);
        }
      } catch (error) {
        if (signal?.aborted) throw error;
      }
    }

    let missed = null; // the release the edge has just missed in, for the origin
    if (this.edge) {
      try {
        const response = await this.fetch(
          `${this.edge}/v1/lookup`,  // POST: the question stays out of URLs and access logs
          { method: "POST", signal,
            body: JSON.stringify(this.profile ? { q: question, profile: this.profile }
                                              : { q: question }),
            headers: { "content-type": "application/json", ...this.userHeaders() } });
        if (response.status === 200) {
          const firstByte = now();
          const hit = await response.json();
          onText(hit.answer);
          return done(hit.tier, "edge", hit.answer, firstByte);
        }
        if (response.status === 404) {
          const miss = await response.json();
          if (miss?.miss === true) missed = missedHint(miss.profile, miss.version);
        }
      } catch (error) {
        if (signal?.aborted) throw error;
      }
    }

    return this.generate(question, { onText, signal, maxTokens, started, done, missed });
  }

  async generate(question, { onText, signal, maxTokens, started, done, missed = null }) {
    const headers = { "content-type": "application/json", ...this.userHeaders() };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    if (missed) headers[MISSED_HEADER] = missed;
    const body = { messages: [{ role: "user", content: question }], stream: true };
    if (this.model) body.model = this.model;
    if (maxTokens) body.max_tokens = maxTokens;
    const response = await this.fetch(`${this.origin}/v1/chat/completions`, {
      method: "POST", headers, body: JSON.stringify(body), signal });
    if (!response.ok) {
      let message = `${response.status}`;
      try { message = (await response.json()).error.message; } catch { /* not JSON */ }
      const error = new Error(`origin: ${message}`);
      error.status = response.status;
      error.retryAfter = response.headers.get("retry-after");
      throw error;
    }
    const tier = response.headers.get("x-edgeqa-tier") || "generated";
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let answer = "";
    let firstByte = null;
    for (;;) {
      const { value, done: finished } = await reader.read();
      if (finished) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(`origin: ${chunk.error.message}`);
        const text = chunk.choices?.[0]?.delta?.content;
        if (text) {
          if (firstByte === null) firstByte = now();
          answer += text;
          onText(text);
        }
      }
    }
    return done(tier, "origin", answer, firstByte ?? now());
  }
}
