// edgeqa web client: the key spec and the tiered lookup, as a dependency-free ES module.
//
// Key spec (docs/key-spec.md; the same steps as edge_index/keys.py, checked against
// tests/vectors/keys.json by web/test/keys.test.mjs):
//   normalize(q) = NFKC -> lower-case -> each whitespace run becomes one space -> strip ->
//                  strip a trailing run of ? ! . 。 ？ ！ … ~ with the spaces around it
//   key(q)       = hex(SHA-256(UTF-8(normalize(q))))            (WebCrypto)
//
// Tiered lookup (EdgeQAClient.ask):
//   1. exact  — <cdn>/<profile>/current.json (cached) -> <cdn>/<profile>/releases/<v>/a/<key>.json
//   2. edge   — POST <edge>/v1/lookup {"q"}  (exact or semantic, FAISS + calibrated decision)
//   3. origin — POST <origin>/v1/chat/completions, streamed (SSE); the origin may still answer
//               from its own tiers (x-edgeqa-tier: exact | semantic | origin_cache | generated)
// and reports which tier answered and the time to the first byte of the answer.

export const MAX_QUERY_CHARS = 2048;

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

export async function keyOfNormalized(normalized) {
  const digest = await globalThis.crypto.subtle.digest(
    "SHA-256", new TextEncoder().encode(normalized));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

export async function key(query, maxQueryChars = MAX_QUERY_CHARS) {
  return keyOfNormalized(normalize(query, maxQueryChars));
}

const now = () => globalThis.performance.now();

// Why an answer object from the CDN must not be shown for `key` ("malformed", "key", "profile",
// "version", "expired"), or null when it may: the rule of edge_index/release.py's
// answer_object_problem, checked on the same vectors (tests/vectors/answer_objects.json).
export function answerObjectProblem(object, { key, profile, version, nowMs = Date.now() }) {
  if (!object || typeof object !== "object" || typeof object.answer !== "string") {
    return "malformed";
  }
  for (const [name, expected] of [["key", key], ["profile", profile], ["version", version]]) {
    if (object[name] !== expected) return name;
  }
  const expires = typeof object.expires_at === "string" &&
    /(Z|[+-]\d\d:\d\d)$/.test(object.expires_at) ? Date.parse(object.expires_at) : NaN;
  if (Number.isNaN(expires)) return "malformed";
  return expires <= nowMs ? "expired" : null;
}

export class EdgeQAClient {
  // cdn: base URL of the release store (CloudFront); profile: the release profile;
  // edge: the edge index service; origin: the origin server. Any of cdn/edge may be empty.
  // userToken: the signed user token your backend minted (docs/security.md#identity), if any.
  constructor({ cdn = "", profile = "", edge = "", origin = "", model = "", apiKey = "",
                userToken = "", pointerTtlMs = 30000,
                fetch = globalThis.fetch.bind(globalThis) } = {}) {
    Object.assign(this, { cdn, profile, edge, origin, model, apiKey, userToken, pointerTtlMs });
    this.fetch = fetch;
    this.pointer = null; // { version, at }
  }

  userHeaders() {
    return this.userToken ? { "x-edgeqa-user": this.userToken } : {};
  }

  async currentVersion() {
    if (!this.cdn || !this.profile) return null;
    if (this.pointer && now() - this.pointer.at < this.pointerTtlMs) return this.pointer.version;
    try {
      const response = await this.fetch(`${this.cdn}/${this.profile}/current.json`);
      const version = response.ok ? (await response.json()).version : null;
      this.pointer = { version, at: now() };
      return version;
    } catch {
      return null; // the CDN is down: the other tiers still answer
    }
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

    const version = await this.currentVersion();
    if (version) {
      try {
        const url = `${this.cdn}/${this.profile}/releases/${version}/a/${k}.json`;
        const response = await this.fetch(url, { signal });
        if (response.ok) {
          const firstByte = now();
          const object = await response.json();
          if (answerObjectProblem(object, { key: k, profile: this.profile, version }) === null) {
            onText(object.answer);
            return done("exact", "cdn", object.answer, firstByte);
          }
        }
      } catch (error) {
        if (signal?.aborted) throw error;
      }
    }

    if (this.edge) {
      try {
        const response = await this.fetch(
          `${this.edge}/v1/lookup`,  // POST: the question stays out of URLs and access logs
          { method: "POST", signal, body: JSON.stringify({ q: question }),
            headers: { "content-type": "application/json", ...this.userHeaders() } });
        if (response.status === 200) {
          const firstByte = now();
          const hit = await response.json();
          onText(hit.answer);
          return done(hit.tier, "edge", hit.answer, firstByte);
        }
      } catch (error) {
        if (signal?.aborted) throw error;
      }
    }

    return this.generate(question, { onText, signal, maxTokens, started, done });
  }

  async generate(question, { onText, signal, maxTokens, started, done }) {
    const headers = { "content-type": "application/json", ...this.userHeaders() };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
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
