output "webserver_url" {
  description = "The Airflow UI (private)."
  value       = aws_mwaa_environment.this.webserver_url
}

output "dags_bucket" {
  description = "The DAG bucket: the DAG, the packages it imports, requirements.txt, the startup script (this apply uploads them)."
  value       = aws_s3_bucket.dags.bucket
}

output "security_group_id" {
  description = "The MWAA workers' security group (the Ray head's Jobs API admits it)."
  value       = aws_security_group.mwaa.id
}
