# A WAFv2 web ACL with AWS managed rules: known bad inputs (Log4j and friends) blocked, the common
# rule set blocked where asked, anonymous IPs counted (VPN and privacy-relay users are customers
# too; alarms watch the count), a per-IP rate limit where asked; logs to CloudWatch.
# The rate limit counts each IPv6 address (/128) apart: WAF aggregates on an IP only as the whole
# address, and none of its rate-based keys (IP, forwarded IP, header, cookie, query, label, ASN,
# JA3/JA4) takes a prefix, so one host with a /64 is not held to it here. A header key would not
# do either: the CDN's WAF runs before a CloudFront function or Lambda@Edge could add one, so the
# only headers it sees are the client's own. The per-host bound is the services': an IPv6 /64 is
# one asker (base/users.py); the CDN can also serve IPv4 only (modules/cdn's ipv6_enabled),
# where each host has one address.
# scope = "REGIONAL" for a load balancer, "CLOUDFRONT" (provider in us-east-1) for a distribution.

# the value of the header that exempts a request from the rate limit: read from Secrets Manager by
# whoever applies, never a variable
data "aws_secretsmanager_secret_version" "exempt" {
  count     = var.rate_limit_exempt_header == null ? 0 : 1
  secret_id = var.rate_limit_exempt_header.secret_arn
}

locals {
  managed = concat(
    [{ name = "AWSManagedRulesKnownBadInputsRuleSet", metric = "known-bad-inputs", count = false }],
    var.common_rules ? [{ name = "AWSManagedRulesCommonRuleSet", metric = "common", count = false }] : [],
    [{ name = "AWSManagedRulesAnonymousIpList", metric = "anonymous-ip", count = true }],
  )
}

resource "aws_wafv2_web_acl" "this" {
  name  = var.name
  scope = var.scope

  default_action {
    allow {}
  }

  dynamic "rule" {
    for_each = local.managed
    content {
      name     = rule.value.metric
      priority = rule.key + 1
      override_action {
        dynamic "none" {
          for_each = rule.value.count ? [] : [1]
          content {}
        }
        dynamic "count" {
          for_each = rule.value.count ? [1] : []
          content {}
        }
      }
      statement {
        managed_rule_group_statement {
          vendor_name = "AWS"
          name        = rule.value.name
        }
      }
      visibility_config {
        cloudwatch_metrics_enabled = true
        metric_name                = "${var.name}-${rule.value.metric}"
        sampled_requests_enabled   = true
      }
    }
  }

  dynamic "rule" {
    for_each = var.rate_limit_per_5min > 0 ? [var.rate_limit_per_5min] : []
    content {
      name     = "rate-limit"
      priority = 10
      action {
        block {}
      }
      statement {
        rate_based_statement {
          limit              = rule.value
          aggregate_key_type = "IP" # the whole address: an IPv6 /128, not its /64 (above)
          dynamic "scope_down_statement" {
            for_each = var.rate_limit_exempt_header == null ? [] : [var.rate_limit_exempt_header]
            content {
              not_statement {
                statement {
                  byte_match_statement {
                    positional_constraint = "EXACTLY"
                    search_string         = data.aws_secretsmanager_secret_version.exempt[0].secret_string
                    field_to_match {
                      single_header {
                        name = scope_down_statement.value.name
                      }
                    }
                    text_transformation {
                      priority = 0
                      type     = "NONE"
                    }
                  }
                }
              }
            }
          }
        }
      }
      visibility_config {
        cloudwatch_metrics_enabled = true
        metric_name                = "${var.name}-rate-limit"
        sampled_requests_enabled   = true
      }
    }
  }

  visibility_config {
    cloudwatch_metrics_enabled = true
    metric_name                = var.name
    sampled_requests_enabled   = true
  }
}

resource "aws_cloudwatch_log_group" "this" {
  # WAF requires the aws-waf-logs- prefix
  name              = "aws-waf-logs-${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  #checkov:skip=CKV_AWS_158:For CloudFront (us-east-1) the store's regional key cannot be used and kms_key_arn is null: the AWS-owned key encrypts; regional ACLs pass the store's key
}

resource "aws_wafv2_web_acl_logging_configuration" "this" {
  resource_arn            = aws_wafv2_web_acl.this.arn
  log_destination_configs = [aws_cloudwatch_log_group.this.arn]
  # credentials, user tokens, tenants and the question (a GET lookup's query string) never reach
  # the log
  redacted_fields {
    single_header {
      name = "authorization"
    }
  }
  redacted_fields {
    single_header {
      name = "x-api-key"
    }
  }
  redacted_fields {
    single_header {
      name = "x-edgeqa-user"
    }
  }
  redacted_fields {
    single_header {
      name = "x-edgeqa-tenant"
    }
  }
  redacted_fields {
    single_header {
      name = "x-edgeqa-origin-verify"
    }
  }
  redacted_fields {
    query_string {}
  }
}
