# MWAA (managed Airflow) running dags/nightly_edge_release.py. Its own bucket holds the DAG, the
# project's packages the DAG imports, requirements.txt and the startup script, all uploaded here
# (MWAA needs a versioned bucket of its own). No stage runs on a worker: each
# task submits its stage as a Ray Job to the Ray cluster (modules/ray) over the head's Jobs API,
# at the address the startup script exports as EDGEQA_RAY_JOBS_ADDRESS (the head's internal NLB,
# 8265), and follows it; mine's, build's and validate's jobs ask for the Ray resource the script
# exports as EDGEQA_RAY_CPU_RESOURCE (cpu_worker), so their drivers run on a CPU worker. The
# stages' drivers run on the Ray pods with their own roles, so the execution role has MWAA's own
# needs only: no access to the store, no kms:Sign.

resource "aws_s3_bucket" "dags" {
  bucket = "${var.name}-dags-${var.account_id}"
  #checkov:skip=CKV_AWS_144:The DAG source is in git; the bucket is a deployment copy
  #checkov:skip=CKV2_AWS_62:MWAA polls the bucket; nothing reacts to events
  #checkov:skip=CKV_AWS_18:Access to DAG code is audited by CloudTrail data events
}

resource "aws_s3_bucket_versioning" "dags" {
  bucket = aws_s3_bucket.dags.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "dags" {
  bucket = aws_s3_bucket.dags.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = var.kms_key_arn
    }
  }
}

resource "aws_s3_bucket_public_access_block" "dags" {
  bucket                  = aws_s3_bucket.dags.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_lifecycle_configuration" "dags" {
  bucket = aws_s3_bucket.dags.id
  rule {
    id     = "old-versions"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = 90
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = 2
    }
  }
}

data "aws_vpc" "this" {
  id = var.vpc_id
}

resource "aws_security_group" "mwaa" {
  name        = "${var.name}-mwaa"
  description = "${var.name}: MWAA components talk to each other"
  vpc_id      = var.vpc_id

  ingress {
    description = "MWAA components"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    self        = true
  }
  egress {
    description = "HTTPS to S3, CloudWatch, SQS and the Airflow metadata database"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
    #checkov:skip=CKV_AWS_382:AWS APIs have no fixed CIDR; egress is HTTPS only
  }
  egress {
    description = "Ray Jobs API on the Ray head's internal NLB (each task submits its stage)"
    from_port   = 8265
    to_port     = 8265
    protocol    = "tcp"
    cidr_blocks = [data.aws_vpc.this.cidr_block]
  }
  egress {
    description = "MWAA components among themselves (metadata database, workers)"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    self        = true
  }
}

resource "aws_s3_object" "startup" {
  bucket     = aws_s3_bucket.dags.id
  key        = "startup.sh"
  kms_key_id = var.kms_key_arn
  # the DAG's settings: where its tasks submit their stages, and the Ray resource the CPU stages'
  # jobs (mine, build, validate) ask for so that their drivers run on a CPU worker (the signing
  # key, the GPU ceiling and the store access are the Ray pods', where the stages run); the
  # store the stages read and publish to (EDGEQA_STORE: a run config cannot name another)
  content = <<-SH
    #!/bin/sh
    export EDGEQA_RAY_JOBS_ADDRESS='${var.ray_jobs_address}'
    export EDGEQA_RAY_CPU_RESOURCE='${var.ray_cpu_resource}'
    export EDGEQA_STORE='s3://${var.bucket_name}'
  SH
}

# What the DAG file and its tasks import beyond Airflow and the project's own code, pinned to the
# Ray image's versions (requirements.txt beside this file says why these and no others)
resource "aws_s3_object" "requirements" {
  bucket      = aws_s3_bucket.dags.id
  key         = "requirements.txt"
  source      = "${path.module}/requirements.txt"
  source_hash = filemd5("${path.module}/requirements.txt") # a KMS object's ETag is not its MD5
  kms_key_id  = var.kms_key_arn
}

# The DAG, and the project's packages it imports: the DAG file parses with precompute.config
# (base, origin.config, origin.precision, policy) and its tasks submit through
# precompute.fleet.jobs; the project is not installed on MWAA (its heavy dependencies are the Ray
# image's), so its sources sit beside the DAG, on the DAG folder's import path. None of the heavy
# modules among them is imported there (tests/dags checks the task process's imports).
locals {
  dag_files = {
    for path in fileset(var.source_root, "dags/*.py") : "dags/${basename(path)}" => path
  }
  package_files = {
    for path in fileset(var.source_root, "{base,policy,origin,precompute}/**/*.py") : "dags/${path}" => path
  }
}

resource "aws_s3_object" "code" {
  for_each    = merge(local.dag_files, local.package_files)
  bucket      = aws_s3_bucket.dags.id
  key         = each.key
  source      = "${var.source_root}/${each.value}"
  source_hash = filemd5("${var.source_root}/${each.value}")
  kms_key_id  = var.kms_key_arn
}

# the packages are imported, never parsed for DAGs (their docstrings name Airflow and DAGs)
resource "aws_s3_object" "airflowignore" {
  bucket     = aws_s3_bucket.dags.id
  key        = "dags/.airflowignore"
  kms_key_id = var.kms_key_arn
  content    = <<-IGNORE
    base/
    policy/
    origin/
    precompute/
  IGNORE
}

resource "aws_mwaa_environment" "this" {
  name              = var.name
  airflow_version   = var.airflow_version
  environment_class = var.environment_class
  max_workers       = var.max_workers
  source_bucket_arn = aws_s3_bucket.dags.arn
  dag_s3_path       = "dags/"
  # pip installs it when the environment starts or the object's version changes
  requirements_s3_path           = aws_s3_object.requirements.key
  requirements_s3_object_version = aws_s3_object.requirements.version_id
  # exports EDGEQA_* for the tasks (MWAA sets no environment otherwise)
  startup_script_s3_path           = aws_s3_object.startup.key
  startup_script_s3_object_version = aws_s3_object.startup.version_id
  execution_role_arn               = aws_iam_role.mwaa.arn
  kms_key                          = var.kms_key_arn
  webserver_access_mode            = "PRIVATE_ONLY"

  depends_on = [aws_s3_object.code, aws_s3_object.airflowignore]

  airflow_configuration_options = {
    "core.load_examples" = "false"
  }

  network_configuration {
    security_group_ids = [aws_security_group.mwaa.id]
    subnet_ids         = var.private_subnet_ids
  }

  logging_configuration {
    dag_processing_logs {
      enabled   = true
      log_level = "WARNING"
    }
    scheduler_logs {
      enabled   = true
      log_level = "WARNING"
    }
    task_logs {
      enabled   = true
      log_level = "INFO"
    }
    webserver_logs {
      enabled   = true
      log_level = "WARNING"
    }
    worker_logs {
      enabled   = true
      log_level = "WARNING"
    }
  }
}

# -- IAM: MWAA's own needs only (the stages, and their store access, are the Ray head's) ----------

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["airflow.amazonaws.com", "airflow-env.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "mwaa" {
  name               = var.name
  assume_role_policy = data.aws_iam_policy_document.assume.json
}

data "aws_iam_policy_document" "mwaa" {
  statement {
    sid       = "ReadDags"
    actions   = ["s3:GetObject*", "s3:GetBucket*", "s3:List*"]
    resources = [aws_s3_bucket.dags.arn, "${aws_s3_bucket.dags.arn}/*"]
  }
  statement {
    # the environment (kms_key: its logs, queues, metadata) and its DAG bucket are encrypted with it
    sid       = "UseKey"
    actions   = ["kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKey*", "kms:Encrypt"]
    resources = [var.kms_key_arn]
  }
  statement {
    sid       = "AirflowLogs"
    actions   = ["logs:CreateLogStream", "logs:CreateLogGroup", "logs:PutLogEvents", "logs:GetLogEvents", "logs:GetLogRecord", "logs:GetLogGroupFields", "logs:GetQueryResults", "logs:DescribeLogGroups"]
    resources = ["arn:aws:logs:${var.region}:${var.account_id}:log-group:airflow-${var.name}-*"]
  }
  statement {
    sid       = "AirflowMetrics"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"] # PutMetricData has no resource-level permissions; the namespace is pinned
    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = ["AmazonMWAA"]
    }
  }
  statement {
    sid       = "CeleryQueues"
    actions   = ["sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:ReceiveMessage", "sqs:SendMessage"]
    resources = ["arn:aws:sqs:${var.region}:*:airflow-celery-*"]
  }
}

resource "aws_iam_role_policy" "mwaa" {
  name   = var.name
  role   = aws_iam_role.mwaa.id
  policy = data.aws_iam_policy_document.mwaa.json
}
