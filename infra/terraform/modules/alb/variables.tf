variable "name" {
  description = "Name of the load balancer and its companions (32 characters at most)."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the load balancer and its targets."
  type        = string
}

variable "public_subnet_ids" {
  description = "Subnets of the load balancer."
  type        = list(string)
}

variable "certificate_arn" {
  description = "ACM certificate of the HTTPS listener."
  type        = string
}

variable "target_port" {
  description = "Port the targets listen on."
  type        = number
}

variable "target_type" {
  description = "instance (Auto Scaling group) or ip (Fargate)."
  type        = string
}

variable "access_logs_bucket" {
  description = "Bucket for the access logs (written under alb/<name>/)."
  type        = string
}

variable "kms_key_arn" {
  description = "KMS key of the WAF log group."
  type        = string
}

variable "idle_timeout" {
  description = "Seconds a connection may stay idle (long for streamed answers)."
  type        = number
  default     = 120
}

variable "deregistration_delay" {
  description = "Seconds a draining target keeps its connections."
  type        = number
  default     = 30
}

variable "origin_verify_secret_arn" {
  description = "Secrets Manager secret holding the value CloudFront sends as x-edgeqa-origin-verify; the load balancer refuses requests without it. Read by Terraform (its value is never a variable)."
  type        = string
}

variable "health_check_path" {
  description = "What the target group polls: the edge's /ready (503 until a release is served), the origin's /health."
  type        = string
  default     = "/health"
}
