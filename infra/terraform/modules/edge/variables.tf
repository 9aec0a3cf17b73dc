variable "name" {
  description = "Name of this region's edge service resources."
  type        = string
}

variable "region" {
  description = "Region of this edge service (log configuration)."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the service."
  type        = string
}

variable "public_subnet_ids" {
  description = "Subnets of the ALB."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Subnets of the tasks."
  type        = list(string)
}

variable "certificate_arn" {
  description = "ACM certificate of the ALB."
  type        = string
}

variable "image" {
  description = "Container image running `edgeqa edge serve`."
  type        = string
}

variable "desired_count" {
  description = "Tasks."
  type        = number
}

variable "cpu" {
  description = "Task CPU units (one semantic lookup: ~7 ms of one core)."
  type        = number
  default     = 1024
}

variable "memory" {
  description = "Task memory in MiB (1M entries with 384-d vectors: ~2 GB of shards)."
  type        = number
  default     = 4096
}

variable "bucket_arn" {
  description = "The store bucket."
  type        = string
}

variable "bucket_name" {
  description = "The store bucket's name (EDGEQA_STORE)."
  type        = string
}

variable "kms_key_arn" {
  description = "The store's KMS key."
  type        = string
}

variable "access_logs_bucket" {
  description = "Bucket for the ALB's access logs."
  type        = string
}

variable "profiles" {
  description = "The release profiles served (EDGEQA_PROFILE, comma-joined); the task may read these profiles' pointers, revocation lists and releases only."
  type        = list(string)
}

variable "high_water_table_name" {
  description = "The DynamoDB table of the high-water mark (EDGEQA_HIGH_WATER_URI=dynamodb://<name>)."
  type        = string
}

variable "high_water_table_arn" {
  description = "ARN of the high-water mark's table: the task may read it (GetItem), never write it."
  type        = string
}

variable "user_salt_secret_arn" {
  description = "Secret holding EDGEQA_USER_SALT."
  type        = string
}

variable "log_retention_days" {
  description = "Days the service's logs are kept."
  type        = number
}

variable "origin_verify_secret_arn" {
  description = "Secrets Manager secret holding the value CloudFront sends as x-edgeqa-origin-verify; the load balancer refuses requests without it. Read by Terraform (its value is never a variable)."
  type        = string
}

variable "identity_secret_arn" {
  description = "Secret holding EDGEQA_IDENTITY_SECRET (verifies user tokens)."
  type        = string
}

variable "release_public_keys" {
  description = "EDGEQA_RELEASE_PUBLIC_KEYS: the keys releases must be signed with."
  type        = string
}
