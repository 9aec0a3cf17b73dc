variable "name" {
  description = "Name of the web ACL."
  type        = string
}

variable "scope" {
  description = "REGIONAL (a load balancer) or CLOUDFRONT (a distribution; provider in us-east-1)."
  type        = string
}

variable "common_rules" {
  description = "Also block with AWS's common rule set (off in front of the release objects)."
  type        = bool
  default     = true
}

variable "rate_limit_per_5min" {
  description = "Requests per client IP (IPv6: per /128; WAF aggregates no prefix) per 5 minutes before blocking; 0 turns the limit off."
  type        = number
  default     = 0
}

variable "kms_key_arn" {
  description = "KMS key of the WAF log group (null: the AWS-owned key)."
  type        = string
  default     = null
}

variable "rate_limit_exempt_header" {
  description = "Requests carrying the header `name` with the value of the Secrets Manager secret `secret_arn` are not rate-limited by IP (null: none)."
  type        = object({ name = string, secret_arn = string })
  default     = null
}

variable "log_retention_days" {
  description = "Days CloudWatch keeps the WAF's logs (credentials, tokens, the origin secret and query strings are redacted)."
  type        = number
  default     = 400
}
