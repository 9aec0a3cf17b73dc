// CloudFront Function (cloudfront-js-2.0, viewer request) of the store's behaviors: only the
// release objects the clients read pass (web/edgeqa.js, edgeqa/client.py), the rest is answered
// 404 here and never reaches the bucket:
//   /<profile>/current.json                                   the pointer
//   /<profile>/releases/<version>/k/<3 hex>.json              a bucket of the key index
//   /<profile>/a/<2 hex>/<64 hex>.json                        an answer object (by its sha256)
// <profile>: base/release.py's names (lowercase letters, digits, '-'); <version>: precompute/
// build.py's (YYYYMMDDTHHMMSSZ-<8 hex>). Manifests, shards, digests, embedders, revocation
// lists, work areas and logs are never served, whatever the bucket policy allows.
// tests/infra/test_iam_patterns.py runs this handler in node against those paths.
var RELEASE_PATHS = [
  /^\/[a-z0-9][a-z0-9-]{0,127}\/current\.json$/,
  /^\/[a-z0-9][a-z0-9-]{0,127}\/releases\/[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}\/k\/[0-9a-f]{3}\.json$/,
  /^\/[a-z0-9][a-z0-9-]{0,127}\/a\/[0-9a-f]{2}\/[0-9a-f]{64}\.json$/,
];

function handler(event) {
  var request = event.request;
  var uri = request.uri;
  for (var i = 0; i < RELEASE_PATHS.length; i++) {
    if (RELEASE_PATHS[i].test(uri)) {
      request.querystring = {}; // nothing varies by query: one cache entry an object
      return request;
    }
  }
  return {
    statusCode: 404,
    statusDescription: "Not Found",
    headers: {
      "content-type": { value: "application/json" },
      "cache-control": { value: "no-store" },
      "x-content-type-options": { value: "nosniff" },
      "content-security-policy": { value: "default-src 'none'; frame-ancestors 'none'; sandbox" },
    },
  };
}
