output "alb_dns_name" {
  description = "The origin's load balancer."
  value       = module.alb.dns_name
}

output "autoscaling_group_name" {
  description = "The origin's Auto Scaling group."
  value       = aws_autoscaling_group.origin.name
}
