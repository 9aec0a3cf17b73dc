variable "name" {
  description = "Prefix of the bucket and key names."
  type        = string
}

variable "account_id" {
  description = "AWS account id (bucket names are global: they carry it)."
  type        = string
}

variable "log_days" {
  description = "Days request logs and access logs are kept (mining reads the last 7)."
  type        = number
  default     = 90
}
