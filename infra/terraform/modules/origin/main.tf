# The origin: an Auto Scaling group of GPU instances (g5.xlarge: one A10) running
# `edgeqa origin serve` behind an ALB, scaled on the queue depth each origin exports
# (vllm:num_requests_waiting, published to CloudWatch as EdgeQA/Origin NumRequestsWaiting by the
# CloudWatch agent on the instance, which scrapes /metrics).

data "aws_vpc" "this" {
  id = var.vpc_id
}

module "alb" {
  source                   = "../alb"
  name                     = var.name
  vpc_id                   = var.vpc_id
  public_subnet_ids        = var.public_subnet_ids
  certificate_arn          = var.certificate_arn
  target_port              = 8000
  target_type              = "instance"
  access_logs_bucket       = var.access_logs_bucket
  kms_key_arn              = var.kms_key_arn
  idle_timeout             = 300
  deregistration_delay     = 60
  origin_verify_secret_arn = var.origin_verify_secret_arn
}

resource "aws_security_group" "instances" {
  name        = "${var.name}-instances"
  description = "${var.name}: the API from the load balancer only"
  vpc_id      = var.vpc_id

  ingress {
    description     = "edgeqa origin serve from the ALB"
    from_port       = 8000
    to_port         = 8000
    protocol        = "tcp"
    security_groups = [module.alb.security_group_id]
  }
  egress {
    description = "HTTPS to S3, Secrets Manager and CloudWatch (VPC endpoints or NAT)"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
    #checkov:skip=CKV_AWS_382:AWS APIs (S3, CloudWatch, Secrets Manager) have no fixed CIDR; egress is HTTPS only
  }
}

resource "aws_launch_template" "origin" {
  name_prefix            = "${var.name}-"
  image_id               = var.ami_id
  instance_type          = var.instance_type
  vpc_security_group_ids = [aws_security_group.instances.id]
  ebs_optimized          = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.origin.arn
  }

  metadata_options {
    http_tokens                 = "required" # IMDSv2 only
    http_endpoint               = "enabled"
    http_put_response_hop_limit = 1
  }

  monitoring {
    enabled = true
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = 100
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = var.kms_key_arn
      delete_on_termination = true
    }
  }

  user_data = base64encode(templatefile("${path.module}/user_data.sh", {
    store                = "s3://${split(":::", var.bucket_arn)[1]}"
    profiles             = join(",", var.profiles)
    region               = var.region
    high_water_uri       = "dynamodb://${var.high_water_table_name}"
    user_salt_secret_arn = var.user_salt_secret_arn
    api_keys_secret_arn  = var.api_keys_secret_arn
    identity_secret_arn  = var.identity_secret_arn
    release_public_keys  = var.release_public_keys
    trusted_proxies      = data.aws_vpc.this.cidr_block # the ALB: its viewer headers are believed
  }))

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = var.name }
  }
}

resource "aws_autoscaling_group" "origin" {
  name                      = var.name
  min_size                  = var.min_size
  max_size                  = var.max_size
  vpc_zone_identifier       = var.private_subnet_ids
  target_group_arns         = [module.alb.target_group_arn]
  health_check_type         = "ELB"
  health_check_grace_period = 600 # the model loads and warms before /health is 200
  default_instance_warmup   = 300

  launch_template {
    id      = aws_launch_template.origin.id
    version = "$Latest"
  }

  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 75
    }
  }

  tag {
    key                 = "Name"
    value               = var.name
    propagate_at_launch = true
  }
}

# scale on queue depth: the average number of requests waiting for a slot per instance
resource "aws_autoscaling_policy" "queue_depth" {
  name                   = "${var.name}-queue-depth"
  autoscaling_group_name = aws_autoscaling_group.origin.name
  policy_type            = "TargetTrackingScaling"

  target_tracking_configuration {
    target_value = var.target_waiting
    customized_metric_specification {
      metric_name = "NumRequestsWaiting"
      namespace   = "EdgeQA/Origin"
      statistic   = "Average"
      unit        = "Count"
      metric_dimension {
        name  = "AutoScalingGroupName"
        value = var.name
      }
    }
  }
}

# -- IAM: read releases, write request logs, read the salt, publish metrics --------------------------

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "origin" {
  name               = var.name
  assume_role_policy = data.aws_iam_policy_document.assume.json
}

# per served profile: its pointer, its revocation list and its releases, nothing else of it (not
# the nightly work areas, not the answer objects); the request logs it writes (a day's folder's
# Parquet files); the high-water mark, read only (tests/infra/test_iam_patterns.py)
data "aws_iam_policy_document" "origin" {
  dynamic "statement" {
    for_each = toset(var.profiles)
    content {
      actions = ["s3:GetObject"]
      resources = [
        "${var.bucket_arn}/${statement.value}/current.json",
        "${var.bucket_arn}/${statement.value}/revocations.json",
        "${var.bucket_arn}/${statement.value}/releases/*",
      ]
    }
  }
  dynamic "statement" {
    for_each = toset(var.profiles)
    content {
      actions   = ["s3:ListBucket"]
      resources = [var.bucket_arn]
      condition {
        test     = "StringLike"
        variable = "s3:prefix"
        values   = ["${statement.value}/releases/*"]
      }
    }
  }
  statement {
    sid       = "WriteRequestLogs"
    actions   = ["s3:PutObject"]
    resources = ["${var.bucket_arn}/logs/dt=????-??-??/*.parquet"]
  }
  statement {
    sid       = "UseStoreKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
  }
  statement {
    sid       = "ReadHighWaterMark"
    actions   = ["dynamodb:GetItem"]
    resources = [var.high_water_table_arn]
  }
  statement {
    sid       = "ReadSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.user_salt_secret_arn, var.api_keys_secret_arn, var.identity_secret_arn]
  }
  statement {
    sid       = "PublishQueueDepth"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"] # PutMetricData has no resource-level permissions; the namespace is pinned
    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = ["EdgeQA/Origin"]
    }
  }
}

resource "aws_iam_role_policy" "origin" {
  name   = var.name
  role   = aws_iam_role.origin.id
  policy = data.aws_iam_policy_document.origin.json
}

resource "aws_iam_instance_profile" "origin" {
  name = var.name
  role = aws_iam_role.origin.name
}
