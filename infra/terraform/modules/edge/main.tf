# The edge index service on ECS Fargate behind its own ALB: one instance of this module per
# region. Tasks read the release from the store (FAISS shards in memory) and write request logs.

locals {
  cache_dir = "/var/cache/edgeqa" # EDGEQA_CACHE_DIR (the Dockerfile's VOLUME)
}

data "aws_vpc" "this" {
  id = var.vpc_id
}

module "alb" {
  source                   = "../alb"
  name                     = var.name
  vpc_id                   = var.vpc_id
  public_subnet_ids        = var.public_subnet_ids
  certificate_arn          = var.certificate_arn
  target_port              = 8001
  target_type              = "ip"
  access_logs_bucket       = var.access_logs_bucket
  kms_key_arn              = var.kms_key_arn
  origin_verify_secret_arn = var.origin_verify_secret_arn
  health_check_path        = "/ready" # no traffic before a release is served
}

resource "aws_ecs_cluster" "edge" {
  name = var.name
  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

resource "aws_cloudwatch_log_group" "edge" {
  name              = "/ecs/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

resource "aws_ecs_task_definition" "edge" {
  family                   = var.name
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.cpu
  memory                   = var.memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.task.arn

  container_definitions = jsonencode([{
    name                   = "edge"
    image                  = var.image
    essential              = true
    readonlyRootFilesystem = true
    privileged             = false
    command                = ["edgeqa", "edge", "serve", "--host", "0.0.0.0", "--port", "8001"]
    portMappings           = [{ containerPort = 8001, protocol = "tcp" }]
    environment = [
      { name = "EDGEQA_STORE", value = "s3://${var.bucket_name}" },
      { name = "EDGEQA_PROFILE", value = join(",", var.profiles) },
      # the highest pointer and revocation-list sequences signed, kept outside the bucket
      { name = "EDGEQA_HIGH_WATER_URI", value = "dynamodb://${var.high_water_table_name}" },
      # the pointers this task verified (base/pointers.py PointerMemory), on its writable volume
      { name = "EDGEQA_CACHE_DIR", value = local.cache_dir },
      # only releases signed by the nightly job's KMS key are served (base/signing.py)
      { name = "EDGEQA_RELEASE_PUBLIC_KEYS", value = var.release_public_keys },
      # the ALB, in the VPC: its viewer headers are believed (base/users.py)
      { name = "EDGEQA_TRUSTED_PROXIES", value = data.aws_vpc.this.cidr_block },
      { name = "AWS_DEFAULT_REGION", value = var.region },
      { name = "TMPDIR", value = "/tmp" },
    ]
    secrets = [
      { name = "EDGEQA_USER_SALT", valueFrom = var.user_salt_secret_arn },
      # verifies the user tokens the deployment's backend mints (base/users.py)
      { name = "EDGEQA_IDENTITY_SECRET", valueFrom = var.identity_secret_arn },
    ]
    mountPoints = [
      { sourceVolume = "tmp", containerPath = "/tmp" },
      { sourceVolume = "cache", containerPath = local.cache_dir },
    ]
    healthCheck = {
      command  = ["CMD-SHELL", "python -c \"import urllib.request; urllib.request.urlopen('http://127.0.0.1:8001/health')\""]
      interval = 15
      retries  = 3
    }
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.edge.name
        awslogs-region        = var.region
        awslogs-stream-prefix = "edge"
      }
    }
  }])

  volume {
    name = "tmp" # a shipped fine-tuned embedder is unpacked here
  }
  # the root filesystem is read-only: EDGEQA_CACHE_DIR lives on this task volume (the image makes
  # the folder, owned by its user, and declares it a VOLUME, so ECS copies it with its owner). It
  # lasts as long as the task: a new task starts with no memory and the high-water mark stands in
  volume {
    name = "cache"
  }
}

resource "aws_security_group" "tasks" {
  name        = "${var.name}-tasks"
  description = "${var.name}: lookups from the load balancer only"
  vpc_id      = var.vpc_id

  ingress {
    description     = "edgeqa edge serve from the ALB"
    from_port       = 8001
    to_port         = 8001
    protocol        = "tcp"
    security_groups = [module.alb.security_group_id]
  }
  egress {
    description = "HTTPS to S3, ECR, Secrets Manager and CloudWatch Logs"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
    #checkov:skip=CKV_AWS_382:AWS APIs have no fixed CIDR; egress is HTTPS only
  }
}

resource "aws_ecs_service" "edge" {
  name            = var.name
  cluster         = aws_ecs_cluster.edge.id
  task_definition = aws_ecs_task_definition.edge.arn
  desired_count   = var.desired_count
  launch_type     = "FARGATE"
  # a new release loads in the running tasks (hot swap); deployments are for new images
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = module.alb.target_group_arn
    container_name   = "edge"
    container_port   = 8001
  }
}

# -- IAM ------------------------------------------------------------------------------------------

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "execution" {
  name               = "${var.name}-execution"
  assume_role_policy = data.aws_iam_policy_document.assume.json
}

data "aws_iam_policy_document" "execution" {
  statement {
    sid       = "EcrLogin"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"] # GetAuthorizationToken has no resource-level permissions
  }
  statement {
    sid       = "PullImage"
    actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    resources = ["arn:aws:ecr:${var.region}:*:repository/*"]
  }
  statement {
    sid       = "WriteLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.edge.arn}:*"]
  }
  statement {
    sid       = "ReadSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [var.user_salt_secret_arn, var.identity_secret_arn]
  }
}

resource "aws_iam_role_policy" "execution" {
  name   = "${var.name}-execution"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution.json
}

resource "aws_iam_role" "task" {
  name               = "${var.name}-task"
  assume_role_policy = data.aws_iam_policy_document.assume.json
}

# per served profile: its pointer, its revocation list and its releases (manifests, shards, key
# indexes, a shipped embedder), nothing else of the profile (not the nightly work areas: held-back
# wordings, hashed askers; not the answer objects, which browsers read through CloudFront); the
# request logs it writes, files of a day's folder (base/logs.py); the high-water mark, read only.
# tests/infra/test_iam_patterns.py evaluates these against the object names.
data "aws_iam_policy_document" "task" {
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
    # the versions of each profile (base/release.py list_versions): keys only, its releases only
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
    # a day's folder's Parquet files (S3 has no one-segment wildcard: '*' also spans '/'; the log
    # reader takes the files directly in the folder only, base/logreader.py)
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
    # the high-water mark (EDGEQA_HIGH_WATER_URI): a fresh task refuses a pointer or a revocation
    # list below the sequences already signed; only the signer writes it
    sid       = "ReadHighWaterMark"
    actions   = ["dynamodb:GetItem"]
    resources = [var.high_water_table_arn]
  }
}

resource "aws_iam_role_policy" "task" {
  name   = "${var.name}-task"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.task.json
}
