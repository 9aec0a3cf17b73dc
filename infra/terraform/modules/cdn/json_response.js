// CloudFront Function (cloudfront-js-2.0, viewer response) of the store's behaviors: every
// object served from the bucket is a JSON document (a pointer, a key index bucket, an answer
// object: release_paths.js lets nothing else through), so it goes out as JSON whatever
// Content-Type its upload set: a browser never renders one as HTML or runs it as a script. The
// response headers policy adds the CSP (default-src 'none'; frame-ancestors 'none'; sandbox)
// and X-Content-Type-Options: nosniff. tests/infra/test_iam_patterns.py runs it in node.
function handler(event) {
  var response = event.response;
  response.headers["content-type"] = { value: "application/json" };
  return response;
}
