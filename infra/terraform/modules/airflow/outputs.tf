output "webserver_url" {
  description = "The Airflow UI (private)."
  value       = aws_mwaa_environment.this.webserver_url
}

output "dags_bucket" {
  description = "Upload dags/ and requirements.txt here."
  value       = aws_s3_bucket.dags.bucket
}

output "security_group_id" {
  description = "The MWAA workers' security group (the Ray head's Jobs API admits it)."
  value       = aws_security_group.mwaa.id
}
