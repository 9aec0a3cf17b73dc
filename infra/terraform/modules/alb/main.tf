# An internet-facing ALB that only CloudFront can reach (its managed prefix list), HTTPS only
# (HTTP redirects), access logs, invalid headers dropped, a regional WAF (modules/waf).
# Used by the origin and by each region's edge service.

data "aws_ec2_managed_prefix_list" "cloudfront" {
  name = "com.amazonaws.global.cloudfront.origin-facing"
}

# the header CloudFront sends: read from Secrets Manager by whoever applies, never a variable (a
# tfvars file, a CI log); the listener rule holds it, so the state does
data "aws_secretsmanager_secret_version" "origin_verify" {
  secret_id = var.origin_verify_secret_arn
}

resource "aws_security_group" "alb" {
  name        = "${var.name}-alb"
  description = "${var.name}: HTTPS from CloudFront only"
  vpc_id      = var.vpc_id

  ingress {
    description     = "HTTPS from CloudFront"
    from_port       = 443
    to_port         = 443
    protocol        = "tcp"
    prefix_list_ids = [data.aws_ec2_managed_prefix_list.cloudfront.id]
  }
  ingress {
    description     = "HTTP from CloudFront (redirected to HTTPS)"
    from_port       = 80
    to_port         = 80
    protocol        = "tcp"
    prefix_list_ids = [data.aws_ec2_managed_prefix_list.cloudfront.id]
  }
  egress {
    description = "To the targets in the VPC"
    from_port   = var.target_port
    to_port     = var.target_port
    protocol    = "tcp"
    cidr_blocks = [data.aws_vpc.this.cidr_block]
  }
}

data "aws_vpc" "this" {
  id = var.vpc_id
}

resource "aws_lb" "this" {
  name                       = var.name
  load_balancer_type         = "application"
  internal                   = false
  security_groups            = [aws_security_group.alb.id]
  subnets                    = var.public_subnet_ids
  drop_invalid_header_fields = true
  enable_deletion_protection = true
  idle_timeout               = var.idle_timeout

  access_logs {
    bucket  = var.access_logs_bucket
    prefix  = "alb/${var.name}"
    enabled = true
  }
}

resource "aws_lb_target_group" "this" {
  #checkov:skip=CKV_AWS_378:TLS ends at the ALB; the targets sit in private subnets, reachable only from it (checkov flags this since forwarding moved from the default action to the CloudFront-header rule)
  name        = var.name
  port        = var.target_port
  protocol    = "HTTP"
  target_type = var.target_type
  vpc_id      = var.vpc_id
  # streams are long: let them finish when a target is drained (EDGEQA_SHUTDOWN_GRACE_S)
  deregistration_delay = var.deregistration_delay

  health_check {
    path                = var.health_check_path
    matcher             = "200"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }
}

resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.this.arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  certificate_arn   = var.certificate_arn

  # only CloudFront (which sends the secret header) is forwarded; anything else is refused
  default_action {
    type = "fixed-response"
    fixed_response {
      content_type = "application/json"
      message_body = "{\"error\": {\"message\": \"use the CDN\"}}"
      status_code  = "403"
    }
  }
}

resource "aws_lb_listener_rule" "from_cloudfront" {
  listener_arn = aws_lb_listener.https.arn
  priority     = 1
  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.this.arn
  }
  condition {
    http_header {
      http_header_name = "x-edgeqa-origin-verify"
      values           = [data.aws_secretsmanager_secret_version.origin_verify.secret_string]
    }
  }
}

resource "aws_lb_listener" "http" {
  load_balancer_arn = aws_lb.this.arn
  port              = 80
  protocol          = "HTTP"

  default_action {
    type = "redirect"
    redirect {
      port        = "443"
      protocol    = "HTTPS"
      status_code = "HTTP_301"
    }
  }
}

module "waf" {
  source      = "../waf"
  name        = var.name
  scope       = "REGIONAL"
  kms_key_arn = var.kms_key_arn
  # behind CloudFront every request comes from a CloudFront address: viewers are rate-limited by
  # the CDN's WAF (and API keys by the origin); here, per IP, what did not come through CloudFront
  rate_limit_per_5min = 300
  rate_limit_exempt_header = {
    name       = "x-edgeqa-origin-verify"
    secret_arn = var.origin_verify_secret_arn
  }
}

resource "aws_wafv2_web_acl_association" "this" {
  resource_arn = aws_lb.this.arn
  web_acl_arn  = module.waf.arn
}
