variable "name" {
  description = "Name of the origin's resources."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the origin."
  type        = string
}

variable "public_subnet_ids" {
  description = "Subnets of the ALB."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Subnets of the instances."
  type        = list(string)
}

variable "certificate_arn" {
  description = "ACM certificate of the ALB."
  type        = string
}

variable "ami_id" {
  description = "GPU AMI with edgeqa installed and the edgeqa-origin systemd unit."
  type        = string
}

variable "instance_type" {
  description = "Instance type (g5.xlarge: one A10)."
  type        = string
}

variable "min_size" {
  description = "Fewest instances."
  type        = number
}

variable "max_size" {
  description = "Most instances."
  type        = number
}

variable "target_waiting" {
  description = "Requests waiting per instance that the scaling policy holds."
  type        = number
}

variable "bucket_arn" {
  description = "The store bucket."
  type        = string
}

variable "kms_key_arn" {
  description = "The store's KMS key (also encrypts the EBS volumes)."
  type        = string
}

variable "access_logs_bucket" {
  description = "Bucket for the ALB's access logs."
  type        = string
}

variable "profiles" {
  description = "The release profiles served (EDGEQA_PROFILE, comma-joined); the instances may read these profiles' pointers, revocation lists and releases only."
  type        = list(string)
}

variable "region" {
  description = "The region of the store and the high-water mark's table (AWS_DEFAULT_REGION of the service)."
  type        = string
}

variable "high_water_table_name" {
  description = "The DynamoDB table of the high-water mark (EDGEQA_HIGH_WATER_URI=dynamodb://<name>)."
  type        = string
}

variable "high_water_table_arn" {
  description = "ARN of the high-water mark's table: the instances may read it (GetItem), never write it."
  type        = string
}

variable "user_salt_secret_arn" {
  description = "Secret holding EDGEQA_USER_SALT."
  type        = string
}

variable "origin_verify_secret_arn" {
  description = "Secrets Manager secret holding the value CloudFront sends as x-edgeqa-origin-verify; the load balancer refuses requests without it. Read by Terraform (its value is never a variable)."
  type        = string
}

variable "api_keys_secret_arn" {
  description = "Secret holding EDGEQA_API_KEYS (comma-separated): the origin is never open on its network."
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
