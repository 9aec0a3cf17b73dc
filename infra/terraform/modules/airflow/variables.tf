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

variable "kms_key_arn" {
  description = "The KMS key of the environment and its DAG bucket (the store's key)."
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
  description = "Most Celery workers (every stage runs on the Ray cluster; a worker only submits and follows it)."
  type        = number
  default     = 8
}

variable "ray_jobs_address" {
  description = "The Ray cluster's Jobs API (http://<host>:8265, the ray module's dashboard_address): the workers' EDGEQA_RAY_JOBS_ADDRESS."
  type        = string
  validation {
    condition     = can(regex("^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?$", var.ray_jobs_address))
    error_message = "ray_jobs_address must be the Ray Jobs API's address, http://<host>:<port>."
  }
}

variable "bucket_name" {
  description = "The store bucket: the workers' EDGEQA_STORE, the only store a night reads logs from and publishes to (a DAG run config cannot name another)."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket_name))
    error_message = "bucket_name must be an S3 bucket name."
  }
}

variable "ray_cpu_resource" {
  description = "The Ray resource the cluster's CPU workers carry (the ray module's cpu_worker_resource): the workers' EDGEQA_RAY_CPU_RESOURCE, which mine's, build's and validate's jobs ask for so that their drivers run on a CPU worker."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9_]{1,64}$", var.ray_cpu_resource))
    error_message = "ray_cpu_resource must be a Ray resource name (letters, digits, underscores)."
  }
}

variable "source_root" {
  description = "The repository's root (the DAG in dags/, the project's packages beside it): uploaded to the DAG bucket."
  type        = string
}
