output "key_arn" {
  description = "ARN of the release signing key (EDGEQA_SIGNING_KMS_KEY of the nightly job)."
  value       = aws_kms_key.releases.arn
}

output "public_key" {
  description = "The signing key's public half, base64 DER (EDGEQA_RELEASE_PUBLIC_KEYS accepts it as is)."
  value       = data.aws_kms_public_key.releases.public_key
}

output "high_water_table_name" {
  description = "The high-water mark's DynamoDB table (EDGEQA_HIGH_WATER_URI=dynamodb://<name>)."
  value       = aws_dynamodb_table.high_water.name
}

output "high_water_table_arn" {
  description = "ARN of the high-water mark's table."
  value       = aws_dynamodb_table.high_water.arn
}
