output "arn" {
  description = "ARN of the web ACL (attach it to a load balancer or a distribution)."
  value       = aws_wafv2_web_acl.this.arn
}
