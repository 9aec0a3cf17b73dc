variable "name" {
  description = "Name prefix of the key and its alias."
  type        = string
}

variable "account_id" {
  description = "The AWS account that administers the key."
  type        = string
}

variable "kms_key_arn" {
  description = "The KMS key the high-water mark's table is encrypted with (the store's)."
  type        = string
}

variable "high_water_writer_role_arns" {
  description = "The roles that sign (hold kms:Sign on the release key) and so may raise the high-water mark: the Ray head's, and the operators' that run edgeqa release revoke/rollback. Every other principal's write is denied by the table's policy."
  type        = list(string)
}
