output "bucket_name" {
  description = "The store bucket."
  value       = aws_s3_bucket.store.bucket
}

output "bucket_arn" {
  description = "ARN of the store bucket."
  value       = aws_s3_bucket.store.arn
}

output "bucket_regional_domain_name" {
  description = "The store bucket's regional domain (CloudFront's S3 origin)."
  value       = aws_s3_bucket.store.bucket_regional_domain_name
}

output "kms_key_arn" {
  description = "The KMS key of the store and the log groups."
  value       = aws_kms_key.store.arn
}

output "access_logs_bucket" {
  description = "Bucket receiving access logs (ALBs write under alb/)."
  value       = aws_s3_bucket.access_logs.bucket
}

output "access_logs_bucket_domain_name" {
  description = "Domain of the access-log bucket (CloudFront logging)."
  value       = aws_s3_bucket.access_logs.bucket_domain_name
}
