# The release signing key: an Ed25519 key pair held by KMS. The nightly job signs each release's
# statement with it (kms:Sign, base/signing.py KmsSigner); its private half never leaves
# KMS. The edge, the origin and browsers verify with the public half (EDGEQA_RELEASE_PUBLIC_KEYS).
# Rotation (docs/security.md#signing): create the next key, give readers both public keys, switch
# the nightly job, drop the old public key once no kept release is signed with it.

resource "aws_kms_key" "releases" {
  description              = "${var.name}: signs edgeqa releases (Ed25519)"
  customer_master_key_spec = "ECC_NIST_EDWARDS25519"
  key_usage                = "SIGN_VERIFY"
  deletion_window_in_days  = 30
  policy                   = data.aws_iam_policy_document.releases.json
  #checkov:skip=CKV_AWS_7:KMS rotates symmetric keys only; an asymmetric signing key is rotated by adding the next key beside it (docs/security.md#signing)
}

data "aws_iam_policy_document" "releases" {
  #checkov:skip=CKV_AWS_109:A key policy's resource is the key itself ("*"); the root statement is AWS's default that delegates to IAM
  #checkov:skip=CKV_AWS_111:A key policy's resource is the key itself ("*"); the signer gets kms:Sign through its own IAM policy
  #checkov:skip=CKV_AWS_356:A key policy's resource is always "*" (this key)
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:aws:iam::${var.account_id}:root"]
    }
  }
}

resource "aws_kms_alias" "releases" {
  name          = "alias/${var.name}-releases"
  target_key_id = aws_kms_key.releases.key_id
}

data "aws_kms_public_key" "releases" {
  key_id = aws_kms_key.releases.arn
}

# -- The high-water mark (base/highwater.py, EDGEQA_HIGH_WATER_URI=dynamodb://<table>) -------------
# The highest pointer and revocation-list sequences ever signed, one item per profile (`profile`,
# numbers `pointer` and `revocations`), kept outside the store: whoever can write the bucket could
# put back an older, validly signed pointer or list, and a reader started fresh would take it.
# Only the signer raises it (a conditional UpdateItem, `attribute_not_exists(x) OR x < :v`: never
# lowered); the edge, the origin and the CPU workers read it. The table's own policy refuses
# every write but the signers' (the Ray head's role, and the operators' roles named in
# var.high_water_writer_role_arns), whatever an identity policy elsewhere grants.

resource "aws_dynamodb_table" "high_water" {
  name                        = "${var.name}-high-water"
  billing_mode                = "PAY_PER_REQUEST"
  hash_key                    = "profile"
  deletion_protection_enabled = true

  attribute {
    name = "profile"
    type = "S"
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }
}

resource "aws_dynamodb_resource_policy" "high_water" {
  resource_arn = aws_dynamodb_table.high_water.arn
  policy       = data.aws_iam_policy_document.high_water.json
}

data "aws_iam_policy_document" "high_water" {
  statement {
    sid    = "OnlyTheSignersWrite"
    effect = "Deny"
    actions = [
      "dynamodb:PutItem",
      "dynamodb:UpdateItem",
      "dynamodb:DeleteItem",
      "dynamodb:BatchWriteItem",
      "dynamodb:PartiQLInsert",
      "dynamodb:PartiQLUpdate",
      "dynamodb:PartiQLDelete",
    ]
    resources = [aws_dynamodb_table.high_water.arn]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "ArnNotEquals"
      variable = "aws:PrincipalArn"
      values   = var.high_water_writer_role_arns
    }
  }
}
