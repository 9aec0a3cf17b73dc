# CloudFront in front of the store and the services:
#   /<profile>/a/*          answer objects, named by their sha256 and shared by releases
#   /<profile>/releases/*   a release's key index (k/*; nothing else of a release is readable);
#                           both immutable, cached a year
#   /*/current.json         the pointer: cached 30 s (a new release reaches browsers within it)
#   (the store's paths pass a CloudFront Function, release_paths.js, that lets through those
#   exact names of the deployed profiles' objects alone and answers 404 to anything else; what is
#   served goes out as application/json with a CSP that allows nothing: json_response.js and the
#   store response headers policy)
#   /v1/lookup*             the edge index service (semantic tier): not cached
#   /v1/*                   the origin (generation, streamed): not cached
# The bucket is read only through origin access control; nothing else is public.

terraform {
  required_providers {
    aws = {
      source                = "hashicorp/aws"
      configuration_aliases = [aws.us_east_1]
    }
  }
}

# the header both load balancers require: read from Secrets Manager by whoever applies, never a
# variable; the distribution's origins hold it, so the state does
data "aws_secretsmanager_secret_version" "origin_verify" {
  secret_id = var.origin_verify_secret_arn
}

resource "aws_cloudfront_origin_access_control" "store" {
  name                              = "${var.name}-store"
  origin_access_control_origin_type = "s3"
  signing_behavior                  = "always"
  signing_protocol                  = "sigv4"
}

resource "aws_cloudfront_cache_policy" "immutable" {
  name        = "${var.name}-immutable"
  min_ttl     = 86400
  default_ttl = 31536000
  max_ttl     = 31536000
  parameters_in_cache_key_and_forwarded_to_origin {
    enable_accept_encoding_gzip   = true
    enable_accept_encoding_brotli = true
    cookies_config {
      cookie_behavior = "none"
    }
    headers_config {
      header_behavior = "none"
    }
    query_strings_config {
      query_string_behavior = "none"
    }
  }
}

resource "aws_cloudfront_cache_policy" "pointer" {
  name        = "${var.name}-pointer"
  min_ttl     = 0
  default_ttl = 30
  max_ttl     = 30
  parameters_in_cache_key_and_forwarded_to_origin {
    enable_accept_encoding_gzip = true
    cookies_config {
      cookie_behavior = "none"
    }
    headers_config {
      header_behavior = "none"
    }
    query_strings_config {
      query_string_behavior = "none"
    }
  }
}

data "aws_cloudfront_cache_policy" "disabled" {
  name = "Managed-CachingDisabled"
}

data "aws_cloudfront_origin_request_policy" "all_viewer" {
  name = "Managed-AllViewerExceptHostHeader"
}

resource "aws_cloudfront_response_headers_policy" "security" {
  name = "${var.name}-security"
  security_headers_config {
    strict_transport_security {
      access_control_max_age_sec = 31536000
      include_subdomains         = true
      preload                    = true
      override                   = true
    }
    content_type_options {
      override = true
    }
    frame_options {
      frame_option = "DENY"
      override     = true
    }
    referrer_policy {
      referrer_policy = "strict-origin-when-cross-origin"
      override        = true
    }
  }
  cors_config {
    access_control_allow_credentials = false
    access_control_allow_headers {
      items = ["*"]
    }
    access_control_allow_methods {
      items = ["GET", "HEAD", "OPTIONS", "POST"]
    }
    access_control_allow_origins {
      items = ["*"]
    }
    access_control_expose_headers {
      items = ["x-edgeqa-tier", "x-request-id", "retry-after"]
    }
    origin_override = false
  }
}

# the store's behaviors: only the release objects' names pass (404 otherwise), and what passes is
# served as JSON (tests/infra/test_iam_patterns.py runs both in node)
resource "aws_cloudfront_function" "release_paths" {
  name    = "${var.name}-release-paths"
  runtime = "cloudfront-js-2.0"
  comment = "only the release objects browsers read: pointers, key index buckets, answer objects"
  publish = true
  code    = file("${path.module}/release_paths.js")
}

resource "aws_cloudfront_function" "json_response" {
  name    = "${var.name}-json-response"
  runtime = "cloudfront-js-2.0"
  comment = "every store object goes out as application/json"
  publish = true
  code    = file("${path.module}/json_response.js")
}

# the store's objects: the security headers, a CSP that allows nothing (a JSON document needs
# none; sandbox: no script, no form, no same origin, even if a browser were made to render one)
resource "aws_cloudfront_response_headers_policy" "store" {
  name = "${var.name}-store"
  security_headers_config {
    strict_transport_security {
      access_control_max_age_sec = 31536000
      include_subdomains         = true
      preload                    = true
      override                   = true
    }
    content_type_options {
      override = true
    }
    frame_options {
      frame_option = "DENY"
      override     = true
    }
    referrer_policy {
      referrer_policy = "strict-origin-when-cross-origin"
      override        = true
    }
    content_security_policy {
      content_security_policy = "default-src 'none'; frame-ancestors 'none'; sandbox"
      override                = true
    }
  }
  cors_config {
    access_control_allow_credentials = false
    access_control_allow_headers {
      items = ["*"]
    }
    access_control_allow_methods {
      items = ["GET", "HEAD", "OPTIONS"]
    }
    access_control_allow_origins {
      items = ["*"]
    }
    access_control_expose_headers {
      items = ["x-edgeqa-tier", "x-request-id", "retry-after"]
    }
    origin_override = false
  }
}

locals {
  store_origin  = "store"
  origin_origin = "origin"
  edge_origin   = "edge"
}

resource "aws_cloudfront_distribution" "this" {
  enabled         = true
  is_ipv6_enabled = var.ipv6_enabled # the WAF's rate limit counts each IPv6 address apart
  comment         = "${var.name}: releases, edge lookups, origin API"
  aliases         = var.aliases
  price_class     = "PriceClass_All"
  web_acl_id      = module.waf.arn
  http_version    = "http2and3"
  #checkov:skip=CKV_AWS_310:Each path has one origin by design; the client falls through tiers itself (CDN -> edge -> origin)
  #checkov:skip=CKV_AWS_374:Answers are served worldwide; restricting geography is a business decision, not a default
  #checkov:skip=CKV_AWS_305:There is no root object: the web page is served by the origin, releases by key

  origin {
    origin_id                = local.store_origin
    domain_name              = var.bucket_domain_name
    origin_access_control_id = aws_cloudfront_origin_access_control.store.id
  }

  origin {
    origin_id   = local.origin_origin
    domain_name = var.origin_domain_name
    custom_origin_config {
      http_port                = 80
      https_port               = 443
      origin_protocol_policy   = "https-only"
      origin_ssl_protocols     = ["TLSv1.2"]
      origin_read_timeout      = 60
      origin_keepalive_timeout = 60
    }
    custom_header {
      name  = "x-edgeqa-origin-verify"
      value = data.aws_secretsmanager_secret_version.origin_verify.secret_string
    }
  }

  origin {
    origin_id   = local.edge_origin
    domain_name = var.edge_domain_name
    custom_origin_config {
      http_port              = 80
      https_port             = 443
      origin_protocol_policy = "https-only"
      origin_ssl_protocols   = ["TLSv1.2"]
    }
    custom_header {
      name  = "x-edgeqa-origin-verify"
      value = data.aws_secretsmanager_secret_version.origin_verify.secret_string
    }
  }

  # the release objects (the default): immutable
  default_cache_behavior {
    target_origin_id           = local.store_origin
    viewer_protocol_policy     = "redirect-to-https"
    allowed_methods            = ["GET", "HEAD", "OPTIONS"]
    cached_methods             = ["GET", "HEAD"]
    compress                   = true
    cache_policy_id            = aws_cloudfront_cache_policy.immutable.id
    response_headers_policy_id = aws_cloudfront_response_headers_policy.store.id
    function_association {
      event_type   = "viewer-request"
      function_arn = aws_cloudfront_function.release_paths.arn
    }
    function_association {
      event_type   = "viewer-response"
      function_arn = aws_cloudfront_function.json_response.arn
    }
  }

  ordered_cache_behavior {
    path_pattern               = "*/current.json"
    target_origin_id           = local.store_origin
    viewer_protocol_policy     = "redirect-to-https"
    allowed_methods            = ["GET", "HEAD", "OPTIONS"]
    cached_methods             = ["GET", "HEAD"]
    compress                   = true
    cache_policy_id            = aws_cloudfront_cache_policy.pointer.id
    response_headers_policy_id = aws_cloudfront_response_headers_policy.store.id
    function_association {
      event_type   = "viewer-request"
      function_arn = aws_cloudfront_function.release_paths.arn
    }
    function_association {
      event_type   = "viewer-response"
      function_arn = aws_cloudfront_function.json_response.arn
    }
  }

  ordered_cache_behavior {
    path_pattern           = "/v1/lookup*"
    target_origin_id       = local.edge_origin
    viewer_protocol_policy = "https-only"
    # POST keeps the question out of URLs and access logs (CloudFront takes all methods or 3)
    allowed_methods            = ["GET", "HEAD", "OPTIONS", "PUT", "POST", "PATCH", "DELETE"]
    cached_methods             = ["GET", "HEAD"]
    cache_policy_id            = data.aws_cloudfront_cache_policy.disabled.id
    origin_request_policy_id   = data.aws_cloudfront_origin_request_policy.all_viewer.id
    response_headers_policy_id = aws_cloudfront_response_headers_policy.security.id
  }

  ordered_cache_behavior {
    path_pattern               = "/v1/*"
    target_origin_id           = local.origin_origin
    viewer_protocol_policy     = "https-only"
    allowed_methods            = ["GET", "HEAD", "OPTIONS", "PUT", "POST", "PATCH", "DELETE"]
    cached_methods             = ["GET", "HEAD"]
    cache_policy_id            = data.aws_cloudfront_cache_policy.disabled.id
    origin_request_policy_id   = data.aws_cloudfront_origin_request_policy.all_viewer.id
    response_headers_policy_id = aws_cloudfront_response_headers_policy.security.id
  }

  restrictions {
    geo_restriction {
      restriction_type = "none"
    }
  }

  viewer_certificate {
    acm_certificate_arn      = var.certificate_arn
    ssl_support_method       = "sni-only"
    minimum_protocol_version = "TLSv1.2_2021"
  }

  logging_config {
    bucket          = var.access_logs_bucket
    prefix          = "cloudfront/"
    include_cookies = false
  }
}

# the bucket admits this distribution only
resource "aws_s3_bucket_policy" "store" {
  bucket = var.bucket_name
  policy = data.aws_iam_policy_document.store.json
}

data "aws_iam_policy_document" "store" {
  dynamic "statement" {
    # per deployed profile: its answer objects, its releases' key indexes and its pointer only
    # (never */a/*, which matched a/ folders anywhere: a work area's, a log day's); manifests,
    # shards, digests, embedders and revocation lists stay private (docs/release-format.md)
    for_each = toset(var.profiles)
    content {
      actions = ["s3:GetObject"]
      resources = [
        "${var.bucket_arn}/${statement.value}/a/*",
        "${var.bucket_arn}/${statement.value}/releases/*/k/*",
        "${var.bucket_arn}/${statement.value}/current.json",
      ]
      principals {
        type        = "Service"
        identifiers = ["cloudfront.amazonaws.com"]
      }
      condition {
        test     = "StringEquals"
        variable = "AWS:SourceArn"
        values   = [aws_cloudfront_distribution.this.arn]
      }
    }
  }
  statement {
    sid       = "TlsOnly"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [var.bucket_arn, "${var.bucket_arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

module "waf" {
  source              = "../waf"
  providers           = { aws = aws.us_east_1 }
  name                = "${var.name}-cdn"
  scope               = "CLOUDFRONT"
  common_rules        = false # the release objects are static JSON; the API behind has its own
  rate_limit_per_5min = var.rate_limit_per_5min
}
