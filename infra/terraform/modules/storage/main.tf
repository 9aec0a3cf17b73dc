# The store: releases (<profile>/releases/, immutable, read by CloudFront only), request logs
# (logs/dt=...), generation checkpoints (<profile>/work/). Versioned, KMS-encrypted, no public
# access; a second bucket receives the access logs of this bucket, CloudFront and the ALBs.

resource "aws_kms_key" "store" {
  description             = "${var.name}: the store, the logs and the services' log groups"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json
}

data "aws_iam_policy_document" "kms" {
  #checkov:skip=CKV_AWS_109:A key policy's resource is the key itself ("*"); the root statement is AWS's default that delegates to IAM
  #checkov:skip=CKV_AWS_111:A key policy's resource is the key itself ("*"); services get narrower grants through their own IAM policies
  #checkov:skip=CKV_AWS_356:A key policy's resource is always "*" (this key)
  # the account administers the key; services use it through their own IAM policies. A service
  # principal uses it only for this account's resources (a distribution, a log group): another
  # account's cannot borrow the grant (the confused deputy)
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:aws:iam::${var.account_id}:root"]
    }
  }
  statement {
    sid       = "CloudFrontReadsReleases"
    actions   = ["kms:Decrypt"]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["cloudfront.amazonaws.com"]
    }
    # this account's distributions (through their origin access control); the distribution's own
    # ARN would close a cycle (it is built on this bucket), so its bucket policy pins it instead
    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:aws:cloudfront::${var.account_id}:distribution/*"]
    }
  }
  statement {
    sid       = "CloudWatchLogsEncrypts"
    actions   = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"]
    principals {
      type        = "Service"
      identifiers = ["logs.amazonaws.com"]
    }
    # CloudWatch Logs names the calling log group in the encryption context (its source ARN):
    # this account's log groups only
    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:aws:logs:*:${var.account_id}:log-group:*"]
    }
  }
}

resource "aws_kms_alias" "store" {
  name          = "alias/${var.name}-store"
  target_key_id = aws_kms_key.store.key_id
}

resource "aws_s3_bucket" "store" {
  bucket = "${var.name}-store-${var.account_id}"
  #checkov:skip=CKV_AWS_144:Releases are rebuilt nightly from the logs and each region's edge reads through CloudFront; cross-region replication would double storage for no recovery gain
  #checkov:skip=CKV2_AWS_62:Nothing reacts to object events: readers poll current.json
}

resource "aws_s3_bucket_versioning" "store" {
  bucket = aws_s3_bucket.store.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "store" {
  bucket = aws_s3_bucket.store.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.store.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_public_access_block" "store" {
  bucket                  = aws_s3_bucket.store.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "store" {
  bucket = aws_s3_bucket.store.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "store" {
  bucket = aws_s3_bucket.store.id
  rule {
    id     = "request-logs"
    status = "Enabled"
    filter {
      prefix = "logs/"
    }
    expiration {
      days = var.log_days
    }
    noncurrent_version_expiration {
      noncurrent_days = 1 # an expired log's old version goes a day later, not a week
    }
  }
  rule {
    id     = "old-versions-and-uploads"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = 30
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }
  }
}

resource "aws_s3_bucket_logging" "store" {
  bucket        = aws_s3_bucket.store.id
  target_bucket = aws_s3_bucket.access_logs.id
  target_prefix = "s3/store/"
}

# -- access logs of the store, CloudFront and the load balancers ------------------------------------

resource "aws_s3_bucket" "access_logs" {
  bucket = "${var.name}-access-logs-${var.account_id}"
  #checkov:skip=CKV_AWS_18:This is the access-log bucket itself; logging it into itself would loop
  #checkov:skip=CKV_AWS_144:Access logs are kept in one region by policy
  #checkov:skip=CKV2_AWS_62:Nothing reacts to access-log objects
  #checkov:skip=CKV_AWS_145:ALB and CloudFront log delivery only support SSE-S3 (AES256) buckets
}

resource "aws_s3_bucket_versioning" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_public_access_block" "access_logs" {
  bucket                  = aws_s3_bucket.access_logs.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "access_logs" {
  #checkov:skip=CKV2_AWS_65:CloudFront standard logging writes objects with ACLs: this bucket must accept them
  bucket = aws_s3_bucket.access_logs.id
  rule {
    # CloudFront standard logging writes with ACLs
    object_ownership = "BucketOwnerPreferred"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id
  rule {
    id     = "expire"
    status = "Enabled"
    filter {}
    expiration {
      days = var.log_days
    }
    noncurrent_version_expiration {
      noncurrent_days = 7
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }
  }
}

data "aws_elb_service_account" "current" {}

resource "aws_s3_bucket_policy" "access_logs" {
  bucket = aws_s3_bucket.access_logs.id
  policy = data.aws_iam_policy_document.access_logs.json
}

data "aws_iam_policy_document" "access_logs" {
  statement {
    sid       = "LoadBalancersWriteLogs"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.access_logs.arn}/alb/*"]
    principals {
      type        = "AWS"
      identifiers = [data.aws_elb_service_account.current.arn]
    }
  }
  statement {
    sid       = "S3WritesServerAccessLogs"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.access_logs.arn}/s3/*"]
    principals {
      type        = "Service"
      identifiers = ["logging.s3.amazonaws.com"]
    }
  }
  statement {
    sid       = "TlsOnly"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.access_logs.arn, "${aws_s3_bucket.access_logs.arn}/*"]
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
