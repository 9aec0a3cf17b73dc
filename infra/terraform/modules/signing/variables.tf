variable "name" {
  description = "Name prefix of the key and its alias."
  type        = string
}

variable "account_id" {
  description = "The AWS account that administers the key."
  type        = string
}
