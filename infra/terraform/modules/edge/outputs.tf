output "alb_dns_name" {
  description = "This region's edge load balancer."
  value       = module.alb.dns_name
}

output "service_name" {
  description = "The ECS service."
  value       = aws_ecs_service.edge.name
}
