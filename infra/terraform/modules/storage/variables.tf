variable "name" {
  description = "Prefix of the bucket and key names."
  type        = string
}

variable "account_id" {
  description = "AWS account id (bucket names are global: they carry it)."
  type        = string
}

variable "log_days" {
  description = "Days request logs and access logs are kept: mining reads the last 7; a week more to re-run a night, no longer (they hold what people typed)."
  type        = number
  default     = 14
}
