variable "name" {
  description = "Prefix of the CloudFront resources."
  type        = string
}

variable "bucket_name" {
  description = "The store bucket."
  type        = string
}

variable "bucket_arn" {
  description = "ARN of the store bucket."
  type        = string
}

variable "bucket_domain_name" {
  description = "Regional domain of the store bucket."
  type        = string
}

variable "kms_key_arn" {
  description = "The store's KMS key (its policy lets CloudFront decrypt)."
  type        = string
}

variable "access_logs_bucket" {
  description = "Domain of the access-log bucket."
  type        = string
}

variable "origin_domain_name" {
  description = "The origin's load balancer."
  type        = string
}

variable "edge_domain_name" {
  description = "The edge service's load balancer."
  type        = string
}

variable "aliases" {
  description = "Domain names of the distribution."
  type        = list(string)
}

variable "certificate_arn" {
  description = "ACM certificate in us-east-1 covering the aliases."
  type        = string
}

variable "rate_limit_per_5min" {
  description = "Requests per client IP (IPv6: per /128, WAF aggregates no prefix) per 5 minutes before WAF blocks it."
  type        = number
  default     = 6000
}

variable "origin_verify_secret_arn" {
  description = "Secrets Manager secret holding the value CloudFront sends as x-edgeqa-origin-verify; the load balancer refuses requests without it. Read by Terraform (its value is never a variable)."
  type        = string
}

variable "ipv6_enabled" {
  description = "Serve viewers over IPv6 too. false: IPv4 only, so the WAF's per-IP rate limit holds per host (it counts each IPv6 address apart, and a host may use any address of its /64)."
  type        = bool
  default     = true
}

variable "profiles" {
  description = "The release profiles served: CloudFront may read these profiles' pointers, key indexes and answer objects only."
  type        = list(string)
}
