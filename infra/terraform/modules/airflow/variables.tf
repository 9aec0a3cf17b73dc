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
  description = "Most Celery workers (the GPU stages run on the Ray cluster; a worker only drives them)."
  type        = number
  default     = 8
}

variable "signing_key_arn" {
  description = "The KMS key releases are signed with (the signing module's key_arn)."
  type        = string
}

variable "ray_workers" {
  description = "The most GPU workers a Ray job asks the cluster for (the ray module's max_gpu_workers): the workers' EDGEQA_RAY_WORKERS."
  type        = number
  validation {
    condition     = var.ray_workers >= 1
    error_message = "ray_workers must be at least 1."
  }
}

variable "ray_address" {
  description = "The Ray cluster's Ray Client address (ray://<host>:10001, the ray module's client_address): the workers' EDGEQA_RAY_ADDRESS."
  type        = string
  validation {
    condition     = startswith(var.ray_address, "ray://")
    error_message = "ray_address must be a Ray Client address, ray://<host>:<port>."
  }
}
