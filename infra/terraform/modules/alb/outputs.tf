output "dns_name" {
  description = "DNS name of the load balancer."
  value       = aws_lb.this.dns_name
}

output "arn_suffix" {
  description = "ARN suffix of the load balancer (CloudWatch dimensions)."
  value       = aws_lb.this.arn_suffix
}

output "target_group_arn" {
  description = "The target group the service registers in."
  value       = aws_lb_target_group.this.arn
}

output "security_group_id" {
  description = "Security group of the load balancer (targets allow it in)."
  value       = aws_security_group.alb.id
}
