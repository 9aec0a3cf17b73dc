output "key_arn" {
  description = "ARN of the release signing key (EDGEQA_SIGNING_KMS_KEY of the nightly job)."
  value       = aws_kms_key.releases.arn
}

output "public_key" {
  description = "The signing key's public half, base64 DER (EDGEQA_RELEASE_PUBLIC_KEYS accepts it as is)."
  value       = data.aws_kms_public_key.releases.public_key
}
