variable "name" {
  description = "Name of the MWAA environment."
  type        = string
}

variable "account_id" {
  description = "AWS account id."
  type        = string
}

variable "region" {
  description = "Region of the environment."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the environment."
  type        = string
}

variable "private_subnet_ids" {
  description = "Two private subnets in different AZs."
  type        = list(string)
}

variable "bucket_arn" {
  description = "The store bucket (logs in, releases out)."
  type        = string
}

variable "kms_key_arn" {
  description = "The store's KMS key."
  type        = string
}

variable "airflow_version" {
  description = "MWAA Airflow version (the DAG uses the Airflow 3 TaskFlow SDK)."
  type        = string
  default     = "3.0.6"
}

variable "environment_class" {
  description = "MWAA environment class."
  type        = string
  default     = "mw1.medium"
}

variable "max_workers" {
  description = "Most Celery workers (generation partitions run in parallel up to the gpu_a10 pool)."
  type        = number
  default     = 8
}

variable "signing_key_arn" {
  description = "The KMS key releases are signed with (the signing module's key_arn)."
  type        = string
}
