# The nightly job's fleet: a Ray cluster on EKS (KubeRay) that runs every stage of the night.
# Each task of the DAG submits its stage as a Ray Job to the head's Jobs API
# (EDGEQA_RAY_JOBS_ADDRESS = http://<internal NLB>:8265) and follows it; the Airflow worker runs
# no stage and holds no store access. Where a job's driver (`edgeqa precompute stage ...`) runs:
# mine, build and validate ask for the CPU workers' custom resource (EDGEQA_RAY_CPU_RESOURCE =
# cpu_worker, which the DAG's tasks get from the airflow module's startup script), so their
# drivers run on a CPU worker pod, with that group's role (ray_cpu: the logs, the work areas and
# the caches across nights, the releases and the answer objects; never current.json, the
# revocation list or the signing key); generate, publish and prune run on the head pod, which
# holds the nightly job's publishing identity (ray_head: it flips current.json and signs with
# the release key). The head has no CPU slot (num-cpus 0): the model stages (embedding the
# wordings, generating answers) are Ray Data jobs whose actors, one engine each, one per GPU, run
# on the GPU workers, whose narrower role (ray) may read the logs and the model weights and read
# and write the work areas only: the actors' pods cannot sign or publish with their own role
# (code on the cluster can still reach the head's: docs/security.md, known weaknesses).
#
# GPUs scale from zero and back: Ray's autoscaler (in-tree, a sidecar of the head) adds a worker
# pod per GPU the actor pools ask for, up to max_replicas; the Cluster Autoscaler grows a GPU node
# group (min 0) for the pods that are pending and removes the nodes once the idle workers are gone.
# The same for the CPU worker group (large-memory r7i/r6a, one pod a node: the drivers of mine,
# build and validate), whose Ray workers carry the custom resource cpu_worker. Each pool is two
# node groups, spot and on-demand, with the same labels and taints: the Cluster Autoscaler's
# priority expander tries the spot group first and falls back to the on-demand one when spot
# gives no node within max-node-provision-time (docs/capacity.md prices both). Between nights only the control plane, one small CPU node (the
# head, the operators) and the NLB are running.
#
# Nothing is public: the EKS API has a private endpoint only, and the Ray head is reached through
# an internal NLB whose security group admits the Airflow workers only (client_security_group_ids).
# The NLB is Terraform's own (in front of a NodePort Service of the head on the CPU nodes) rather
# than one a LoadBalancer Service annotation asks a controller for: the in-tree controller takes no
# security group (CIDR source ranges only) and the AWS Load Balancer Controller would need a role
# that may create and change load balancers and security groups.

terraform {
  required_providers {
    aws = {
      source = "hashicorp/aws"
    }
    helm = {
      source = "hashicorp/helm"
    }
    kubernetes = {
      source = "hashicorp/kubernetes"
    }
  }
}

locals {
  ray_cluster          = "edgeqa-ray" # the RayCluster (fullnameOverride): its pods carry ray.io/cluster=<this>
  namespace            = "ray"
  service_account      = "edgeqa-ray"      # the GPU workers'
  head_service_account = "edgeqa-ray-head" # the head's: generate's, publish's and prune's drivers
  cpu_service_account  = "edgeqa-ray-cpu"  # the CPU workers': mine's, build's and validate's drivers
  image_uid            = 1000              # the Dockerfile's edgeqa user: runAsNonRoot needs it numeric
  image                = regex("^(?P<repository>[^@]+):(?P<tag>[^:/@]+)$", var.image)
  oidc_issuer          = replace(aws_eks_cluster.this.identity[0].oidc[0].issuer, "https://", "")
  # the head's ports on the NLB and the node ports of its Service on the CPU nodes: the Jobs API
  # only (Ray Client, 10001, stays inside the cluster: the DAG no longer uses it)
  head_ports = {
    dashboard = { port = 8265, node_port = 30265 } # the Jobs API (the DAG's tasks), the dashboard
  }
  system_selector = { "edgeqa.io/pool" = "system" }
  gpu_selector    = { "edgeqa.io/pool" = "gpu" }
  cpu_selector    = { "edgeqa.io/pool" = "cpu" }
  # GPUs per instance (g5: A10G, g6: L4; 24 GB each): one Ray worker pod, one actor, per GPU
  gpus = {
    "g5.xlarge"   = 1, "g5.2xlarge" = 1, "g5.4xlarge" = 1, "g5.8xlarge" = 1, "g5.16xlarge" = 1,
    "g5.12xlarge" = 4, "g5.24xlarge" = 4, "g5.48xlarge" = 8,
    "g6.xlarge"   = 1, "g6.2xlarge" = 1, "g6.4xlarge" = 1, "g6.8xlarge" = 1, "g6.16xlarge" = 1,
    "g6.12xlarge" = 4, "g6.24xlarge" = 4, "g6.48xlarge" = 8,
  }
  # every type of the GPU groups has the same GPUs a node (one() fails the plan otherwise): a
  # node's worker pods, and the ceiling below, do not depend on which type spot gave
  gpus_per_node = one(distinct([for t in var.gpu_instance_types : local.gpus[t]]))
  # the most GPU workers (one actor each) the cluster scales to: the stages' EDGEQA_RAY_WORKERS
  max_gpu_workers = var.gpu_max_nodes * local.gpus_per_node
  # the custom Ray resource of the CPU workers: a job or task that asks for it runs there (the
  # DAG's tasks ask for it for mine, build and validate: EDGEQA_RAY_CPU_RESOURCE, the
  # cpu_worker_resource output); one a node, so one such driver a CPU worker at a time
  cpu_worker_resource = { cpu_worker = 1 }
  # vCPU and GiB of the CPU worker types the module accepts: every listed type must hold the
  # worker pod (a precondition of the node groups), whichever spot or on demand gives
  cpu_shapes = {
    "r6i.16xlarge" = { vcpu = 64, gib = 512 }, "r6i.24xlarge" = { vcpu = 96, gib = 768 },
    "r6i.32xlarge" = { vcpu = 128, gib = 1024 },
    "r7i.16xlarge" = { vcpu = 64, gib = 512 }, "r7i.24xlarge" = { vcpu = 96, gib = 768 },
    "r7i.48xlarge" = { vcpu = 192, gib = 1536 },
    "r6a.16xlarge" = { vcpu = 64, gib = 512 }, "r6a.24xlarge" = { vcpu = 96, gib = 768 },
    "r6a.32xlarge" = { vcpu = 128, gib = 1024 }, "r6a.48xlarge" = { vcpu = 192, gib = 1536 },
    "r7a.16xlarge" = { vcpu = 64, gib = 512 }, "r7a.24xlarge" = { vcpu = 96, gib = 768 },
    "r7a.32xlarge" = { vcpu = 128, gib = 1024 }, "r7a.48xlarge" = { vcpu = 192, gib = 1536 },
  }
  cpu_worker_memory_gib = tonumber(trimsuffix(var.cpu_worker_memory, "Gi"))
  cpu_pod_fits = alltrue([
    for t in var.cpu_instance_types : (
      lookup(local.cpu_shapes, t, { vcpu = 0, gib = 0 }).vcpu >= var.cpu_worker_cpu + 4 &&
      lookup(local.cpu_shapes, t, { vcpu = 0, gib = 0 }).gib * 15 / 16 >= local.cpu_worker_memory_gib
    )
  ])
  # DuckDB's budget (MB of 10^6 bytes) within 3/4 of the pod: the rest holds the text rules'
  # processes, Arrow's read-ahead, the Ray worker and the page cache of the vectors' file
  cpu_budget_fits = var.cpu_mining_memory_mb * 1000000 <= local.cpu_worker_memory_gib * 1073741824 * 3 / 4
  # the model the GPU workers generate with (EDGEQA_VLLM_MODEL): a folder under the store's
  # models/ prefix (the Ray pods' roles read it, nothing writes it), or what the variable names
  vllm_model = can(regex("^(s3://|/)", var.vllm_model)) ? var.vllm_model : "s3://${var.bucket_name}/models/${var.vllm_model}"
  # what the Cluster Autoscaler assumes of a node of a worker group while it has none (scale
  # from zero); it reads the same from the node group itself, these tags make it explicit
  gpu_node_template_tags = {
    "k8s.io/cluster-autoscaler/node-template/label/edgeqa.io/pool"                = "gpu"
    "k8s.io/cluster-autoscaler/node-template/label/k8s.amazonaws.com/accelerator" = "nvidia"
    "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"                = "present:NoSchedule"
    "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"            = tostring(local.gpus_per_node)
  }
  cpu_node_template_tags = {
    "k8s.io/cluster-autoscaler/node-template/label/edgeqa.io/pool" = "cpu"
    "k8s.io/cluster-autoscaler/node-template/taint/edgeqa.io/pool" = "cpu:NoSchedule"
  }
  # the worker node groups: two a pool, spot first (the Cluster Autoscaler's priority expander
  # matches the ASG names EKS gives them, eks-<node group>-<id>), on demand when spot has none
  worker_groups = {
    gpu_spot      = aws_eks_node_group.gpu_spot
    gpu_on_demand = aws_eks_node_group.gpu_on_demand
    cpu_spot      = aws_eks_node_group.cpu_spot
    cpu_on_demand = aws_eks_node_group.cpu_on_demand
  }
  node_template_tags = merge([
    for group in keys(local.worker_groups) : {
      for key, value in(startswith(group, "gpu") ? local.gpu_node_template_tags : local.cpu_node_template_tags) :
      "${group} ${key}" => { group = group, key = key, value = value }
    }
  ]...)
  autoscaler_priorities = <<-YAML
    50:
      - ^eks-(gpu|cpu)-spot-.*
    10:
      - .*
  YAML
  service_accounts = {
    autoscaler = "kube-system:cluster-autoscaler"
    ray        = "${local.namespace}:${local.service_account}"
    ray_head   = "${local.namespace}:${local.head_service_account}"
    ray_cpu    = "${local.namespace}:${local.cpu_service_account}"
  }
  # the request logs the fleet mines: a day's folder's Parquet files (base/logs.py). IAM's '*'
  # spans '/', so this also matches logs/dt=<day>/<folder>/x.parquet: only the edge and the
  # origin may write under logs/, and the log reader takes a day's folder's own files only
  high_water_uri             = "dynamodb://${var.high_water_table_name}"
  log_files                  = "logs/dt=????-??-??/*.parquet"
  kuberay_version            = "1.7.0"  # the operator and the ray-cluster chart
  cluster_autoscaler_version = "9.54.0" # chart; its image follows kubernetes_version
  pod_security_context = {
    runAsNonRoot   = true
    runAsUser      = local.image_uid
    runAsGroup     = local.image_uid
    fsGroup        = local.image_uid
    seccompProfile = { type = "RuntimeDefault" }
  }
  container_security_context = {
    allowPrivilegeEscalation = false
    capabilities             = { drop = ["ALL"] }
  }
}

data "aws_vpc" "this" {
  id = var.vpc_id
}

# -- EKS: private endpoint, secrets encrypted with a KMS key, every control plane log ---------------

resource "aws_kms_key" "secrets" {
  description             = "${var.name}: the EKS cluster's Kubernetes secrets"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.secrets_key.json
}

data "aws_iam_policy_document" "secrets_key" {
  #checkov:skip=CKV_AWS_109:A key policy's resource is the key itself ("*"); the root statement is AWS's default that delegates to IAM
  #checkov:skip=CKV_AWS_111:A key policy's resource is the key itself ("*"); EKS uses the key through the grant it creates with the cluster
  #checkov:skip=CKV_AWS_356:A key policy's resource is always "*" (this key)
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:aws:iam::${var.account_id}:root"]
    }
  }
}

resource "aws_kms_alias" "secrets" {
  name          = "alias/${var.name}-eks-secrets"
  target_key_id = aws_kms_key.secrets.key_id
}

# EKS writes the control plane's logs here; created first to set retention and encryption
resource "aws_cloudwatch_log_group" "cluster" {
  name              = "/aws/eks/${var.name}/cluster"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

resource "aws_security_group" "api" {
  name        = "${var.name}-api"
  description = "${var.name}: the private Kubernetes API from inside the VPC (terraform apply, kubectl)"
  vpc_id      = var.vpc_id

  ingress {
    description = "Kubernetes API (authenticated with IAM)"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = length(var.api_cidr_blocks) > 0 ? var.api_cidr_blocks : [data.aws_vpc.this.cidr_block]
  }
}

resource "aws_eks_cluster" "this" {
  name                      = var.name
  version                   = var.kubernetes_version
  role_arn                  = aws_iam_role.cluster.arn
  enabled_cluster_log_types = ["api", "audit", "authenticator", "controllerManager", "scheduler"]

  vpc_config {
    subnet_ids              = var.private_subnet_ids
    security_group_ids      = [aws_security_group.api.id]
    endpoint_private_access = true
    endpoint_public_access  = false
  }

  encryption_config {
    resources = ["secrets"]
    provider {
      key_arn = aws_kms_key.secrets.arn
    }
  }

  access_config {
    authentication_mode = "API"
    # whoever runs terraform apply administers the cluster: the helm and kubernetes providers
    bootstrap_cluster_creator_admin_permissions = true
  }

  upgrade_policy {
    support_type = "STANDARD" # no extended-support fees: upgrade kubernetes_version instead
  }

  depends_on = [
    aws_cloudwatch_log_group.cluster,
    aws_iam_role_policy_attachment.cluster,
  ]
}

resource "aws_iam_openid_connect_provider" "cluster" {
  url            = aws_eks_cluster.this.identity[0].oidc[0].issuer
  client_id_list = ["sts.amazonaws.com"]
}

# -- Nodes: a small system group (the Ray head, KubeRay, the autoscaler); GPU and CPU workers (min 0)

# IMDSv2 with one hop: pods cannot reach the node role's credentials; each uses its own (IRSA)
resource "aws_launch_template" "system" {
  name_prefix = "${var.name}-system-"

  metadata_options {
    http_tokens                 = "required"
    http_endpoint               = "enabled"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = 50
      volume_type           = "gp3"
      encrypted             = true # the account's EBS key: the node group's service role may use it
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${var.name}-system" }
  }
}

# Bottlerocket's NVIDIA variant: the driver and the NVIDIA device plugin (nvidia.com/gpu) are in the
# image; /dev/xvdb holds the container images (the project's image carries torch with CUDA)
resource "aws_launch_template" "gpu" {
  name_prefix = "${var.name}-gpu-"

  metadata_options {
    http_tokens                 = "required"
    http_endpoint               = "enabled"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = 4
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  block_device_mappings {
    device_name = "/dev/xvdb"
    ebs {
      volume_size           = var.gpu_volume_size
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${var.name}-gpu" }
  }
}

# the CPU workers' nodes: one large gp3 root volume with provisioned throughput, where the pods'
# scratch lives (the window's DuckDB database and any spill, the vectors clustering waits on, its
# inverted file's lists while they are built)
resource "aws_launch_template" "cpu" {
  name_prefix = "${var.name}-cpu-"

  metadata_options {
    http_tokens                 = "required"
    http_endpoint               = "enabled"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = var.cpu_volume_size
      volume_type           = "gp3"
      throughput            = var.cpu_volume_throughput
      iops                  = 16000
      encrypted             = true
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${var.name}-cpu" }
  }
}

resource "aws_eks_node_group" "system" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "system"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.private_subnet_ids
  ami_type        = "AL2023_x86_64_STANDARD"
  instance_types  = [var.system_instance_type]
  capacity_type   = "ON_DEMAND"
  labels          = local.system_selector

  scaling_config {
    min_size     = 1
    desired_size = 1
    max_size     = 2
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.system.id
    version = aws_launch_template.system.latest_version
  }

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size] # the Cluster Autoscaler's
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

# The GPU pool: spot first, on demand when spot has none (the Cluster Autoscaler's priority
# expander, below). A reclaimed spot node costs the night only its partitions in flight: each
# answered partition is checkpointed in the work area and a retry answers only the rest.
resource "aws_eks_node_group" "gpu_spot" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "gpu-spot"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.private_subnet_ids
  ami_type        = "BOTTLEROCKET_x86_64_NVIDIA"
  instance_types  = var.gpu_instance_types
  capacity_type   = "SPOT" # preferred: the plan's price (docs/capacity.md)
  labels = merge(local.gpu_selector, {
    # the Cluster Autoscaler waits for the device plugin on such a node instead of adding another
    "k8s.amazonaws.com/accelerator" = "nvidia"
  })

  # only Ray's GPU workers (which tolerate it) land on a GPU node
  taint {
    key    = "nvidia.com/gpu"
    value  = "present"
    effect = "NO_SCHEDULE"
  }

  scaling_config {
    min_size     = 0 # no GPU between nights
    desired_size = 0
    max_size     = var.gpu_max_nodes
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.gpu.id
    version = aws_launch_template.gpu.latest_version
  }

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size] # the Cluster Autoscaler's
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_eks_node_group" "gpu_on_demand" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "gpu-on-demand"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.private_subnet_ids
  ami_type        = "BOTTLEROCKET_x86_64_NVIDIA"
  instance_types  = var.gpu_instance_types
  capacity_type   = "ON_DEMAND" # the fallback while spot has no A10G to give
  labels = merge(local.gpu_selector, {
    # the Cluster Autoscaler waits for the device plugin on such a node instead of adding another
    "k8s.amazonaws.com/accelerator" = "nvidia"
  })

  # only Ray's GPU workers (which tolerate it) land on a GPU node
  taint {
    key    = "nvidia.com/gpu"
    value  = "present"
    effect = "NO_SCHEDULE"
  }

  scaling_config {
    min_size     = 0 # no GPU between nights
    desired_size = 0
    max_size     = var.gpu_max_nodes
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.gpu.id
    version = aws_launch_template.gpu.latest_version
  }

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size] # the Cluster Autoscaler's
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

# The CPU worker pool (the drivers of mine, build and validate): large-memory nodes, spot first
# as well
resource "aws_eks_node_group" "cpu_spot" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "cpu-spot"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.private_subnet_ids
  ami_type        = "AL2023_x86_64_STANDARD"
  instance_types  = var.cpu_instance_types
  capacity_type   = "SPOT" # preferred: the plan's price (docs/capacity.md)
  labels          = local.cpu_selector

  # only Ray's CPU workers (which tolerate it) land on a CPU worker node
  taint {
    key    = "edgeqa.io/pool"
    value  = "cpu"
    effect = "NO_SCHEDULE"
  }

  scaling_config {
    min_size     = 0 # no CPU worker between nights
    desired_size = 0
    max_size     = var.cpu_max_nodes
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.cpu.id
    version = aws_launch_template.cpu.latest_version
  }

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size] # the Cluster Autoscaler's
    precondition {
      condition     = local.cpu_pod_fits
      error_message = "Every cpu_instance_types entry must be a known r6i/r7i/r6a/r7a size with cpu_worker_cpu + 4 vCPU and cpu_worker_memory within 15/16 of its memory."
    }
    precondition {
      condition     = local.cpu_budget_fits
      error_message = "cpu_mining_memory_mb (DuckDB's budget, MB) must stay within 3/4 of cpu_worker_memory."
    }
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_eks_node_group" "cpu_on_demand" {
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = "cpu-on-demand"
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.private_subnet_ids
  ami_type        = "AL2023_x86_64_STANDARD"
  instance_types  = var.cpu_instance_types
  capacity_type   = "ON_DEMAND" # the fallback while spot has none
  labels          = local.cpu_selector

  # only Ray's CPU workers (which tolerate it) land on a CPU worker node
  taint {
    key    = "edgeqa.io/pool"
    value  = "cpu"
    effect = "NO_SCHEDULE"
  }

  scaling_config {
    min_size     = 0 # no CPU worker between nights
    desired_size = 0
    max_size     = var.cpu_max_nodes
  }

  update_config {
    max_unavailable = 1
  }

  launch_template {
    id      = aws_launch_template.cpu.id
    version = aws_launch_template.cpu.latest_version
  }

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size] # the Cluster Autoscaler's
    precondition {
      condition     = local.cpu_pod_fits
      error_message = "Every cpu_instance_types entry must be a known r6i/r7i/r6a/r7a size with cpu_worker_cpu + 4 vCPU and cpu_worker_memory within 15/16 of its memory."
    }
    precondition {
      condition     = local.cpu_budget_fits
      error_message = "cpu_mining_memory_mb (DuckDB's budget, MB) must stay within 3/4 of cpu_worker_memory."
    }
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

resource "aws_autoscaling_group_tag" "node_template" {
  for_each               = local.node_template_tags
  autoscaling_group_name = local.worker_groups[each.value.group].resources[0].autoscaling_groups[0].name

  tag {
    key                 = each.value.key
    value               = each.value.value
    propagate_at_launch = false
  }
}

# -- The Ray head's internal NLB: the Jobs API, from the Airflow workers only ----------------------

resource "aws_security_group" "head" {
  name        = "${var.name}-head"
  description = "${var.name}: the Ray head's load balancer, from the Airflow workers only"
  vpc_id      = var.vpc_id

  ingress {
    description     = "Ray Jobs API and dashboard from the Airflow workers (each task submits its stage)"
    from_port       = 8265
    to_port         = 8265
    protocol        = "tcp"
    security_groups = var.client_security_group_ids
  }
  egress {
    description     = "Job API to the head's node port on the cluster's nodes"
    from_port       = 30265
    to_port         = 30265
    protocol        = "tcp"
    security_groups = [aws_eks_cluster.this.vpc_config[0].cluster_security_group_id]
  }
}

# the nodes (EKS's cluster security group) take the head's node ports from the NLB only
resource "aws_vpc_security_group_ingress_rule" "head_node_ports" {
  for_each                     = local.head_ports
  description                  = "Ray head ${each.key} (node port) from its NLB"
  security_group_id            = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
  referenced_security_group_id = aws_security_group.head.id
  from_port                    = each.value.node_port
  to_port                      = each.value.node_port
  ip_protocol                  = "tcp"
}

resource "aws_lb" "head" {
  name                             = "${var.name}-head"
  internal                         = true
  load_balancer_type               = "network"
  subnets                          = var.private_subnet_ids
  security_groups                  = [aws_security_group.head.id]
  enable_cross_zone_load_balancing = true # the head's node may sit in any one AZ
  enable_deletion_protection       = true
  #checkov:skip=CKV_AWS_91:NLB access logs record TLS listeners only; this is plain TCP (the Ray Jobs API's HTTP) inside the VPC
}

resource "aws_lb_target_group" "head" {
  for_each    = local.head_ports
  name        = "${var.name}-${each.key}"
  port        = each.value.node_port
  protocol    = "TCP"
  target_type = "instance"
  vpc_id      = var.vpc_id

  health_check {
    protocol            = "TCP"
    port                = "traffic-port"
    interval            = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }
}

resource "aws_lb_listener" "head" {
  for_each          = local.head_ports
  load_balancer_arn = aws_lb.head.arn
  port              = each.value.port
  protocol          = "TCP"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.head[each.key].arn
  }
}

resource "aws_autoscaling_attachment" "head" {
  for_each               = local.head_ports
  autoscaling_group_name = aws_eks_node_group.system.resources[0].autoscaling_groups[0].name
  lb_target_group_arn    = aws_lb_target_group.head[each.key].arn
  #checkov:skip=CKV2_AWS_15:The node group's ASG belongs to EKS and keeps EC2 health checks: a Ray head that fails the NLB's check is KubeRay's to restart, not a node to replace
}

# -- In the cluster: KubeRay, the Cluster Autoscaler, the RayCluster -------------------------------

resource "kubernetes_namespace_v1" "ray" {
  metadata {
    name = local.namespace
    labels = {
      # KubeRay's injected containers (GCS wait, autoscaler) do not all meet "restricted"
      "pod-security.kubernetes.io/enforce" = "baseline"
      "pod-security.kubernetes.io/warn"    = "restricted"
    }
  }
  depends_on = [aws_eks_node_group.system]
}

# the GPU workers' identity (IRSA): the store's logs, work areas and models, nothing else
resource "kubernetes_service_account_v1" "ray" {
  metadata {
    name        = local.service_account
    namespace   = kubernetes_namespace_v1.ray.metadata[0].name
    annotations = { "eks.amazonaws.com/role-arn" = aws_iam_role.irsa["ray"].arn }
  }
}

# the head's identity (IRSA): generate's, publish's and prune's drivers run there (signing, the
# pointer's flip)
resource "kubernetes_service_account_v1" "head" {
  metadata {
    name        = local.head_service_account
    namespace   = kubernetes_namespace_v1.ray.metadata[0].name
    annotations = { "eks.amazonaws.com/role-arn" = aws_iam_role.irsa["ray_head"].arn }
  }
}

# the CPU workers' identity (IRSA): mine's, build's and validate's drivers run there (the caches
# across nights, the releases and answer objects; never the pointer, the revocation list or a
# signature)
resource "kubernetes_service_account_v1" "cpu" {
  metadata {
    name        = local.cpu_service_account
    namespace   = kubernetes_namespace_v1.ray.metadata[0].name
    annotations = { "eks.amazonaws.com/role-arn" = aws_iam_role.irsa["ray_cpu"].arn }
  }
}

resource "helm_release" "cluster_autoscaler" {
  name       = "cluster-autoscaler"
  repository = "https://kubernetes.github.io/autoscaler"
  chart      = "cluster-autoscaler"
  version    = local.cluster_autoscaler_version
  namespace  = "kube-system"

  values = [yamlencode({
    cloudProvider = "aws"
    awsRegion     = var.region
    autoDiscovery = { clusterName = aws_eks_cluster.this.name } # EKS tags its node groups' ASGs
    image         = { tag = "v${var.kubernetes_version}.0" }    # the autoscaler's minor is the cluster's
    nodeSelector  = local.system_selector
    rbac = {
      serviceAccount = {
        name        = "cluster-autoscaler"
        annotations = { "eks.amazonaws.com/role-arn" = aws_iam_role.irsa["autoscaler"].arn }
      }
    }
    # spot first: the priority expander picks the highest-priority group that can take the
    # pending pods (the spot groups, by their ASG names), least-waste among equals
    expanderPriorities = local.autoscaler_priorities
    extraArgs = {
      expander                        = "priority,least-waste"
      "max-node-provision-time"       = "5m" # a spot group with no node by then backs off: on demand
      "scale-down-unneeded-time"      = "5m" # a GPU node without Ray workers goes back soon
      "scale-down-delay-after-add"    = "5m"
      "skip-nodes-with-local-storage" = false # Ray's /tmp/ray emptyDir would pin a node forever
    }
  })]

  depends_on = [aws_eks_node_group.system]
}

resource "helm_release" "kuberay_operator" {
  name       = "kuberay-operator"
  repository = "https://ray-project.github.io/kuberay-helm/"
  chart      = "kuberay-operator"
  version    = local.kuberay_version
  namespace  = kubernetes_namespace_v1.ray.metadata[0].name

  values = [yamlencode({
    singleNamespaceInstall = true # namespaced RBAC: it manages the RayCluster beside it only
    nodeSelector           = local.system_selector
  })]
}

resource "helm_release" "ray_cluster" {
  name       = "ray-cluster"
  repository = "https://ray-project.github.io/kuberay-helm/"
  chart      = "ray-cluster"
  version    = local.kuberay_version
  namespace  = kubernetes_namespace_v1.ray.metadata[0].name

  values = [yamlencode({
    fullnameOverride = local.ray_cluster
    image = {
      repository = local.image.repository
      tag        = local.image.tag
      pullPolicy = "IfNotPresent"
    }
    # every pod's: the generation engine and its model (precompute/config.py reads them in the
    # drivers, the GPU workers' actors load the model), so Terraform sets what the plan prices
    common = {
      containerEnv = [
        { name = "AWS_DEFAULT_REGION", value = var.region },
        { name = "EDGEQA_GENERATION_ENGINE", value = var.generation_engine },
        { name = "EDGEQA_VLLM_MODEL", value = local.vllm_model },
        { name = "EDGEQA_VLLM_QUANTIZATION", value = var.vllm_quantization },
      ]
    }
    head = {
      rayVersion              = var.ray_version # >= 2.53: KubeRay probes over HTTP (no wget in the image)
      enableInTreeAutoscaling = true
      autoscalerOptions = {
        upscalingMode      = "Default"
        idleTimeoutSeconds = var.idle_timeout_seconds
        securityContext    = local.container_security_context
      }
      serviceAccountName = local.head_service_account
      # what the drivers run here need (generate, publish, prune: Ray Jobs that ask for no
      # resource); no secret: the key never leaves KMS
      containerEnv = [
        { name = "EDGEQA_SIGNING_KMS_KEY", value = var.signing_key_arn },
        { name = "EDGEQA_RAY_WORKERS", value = tostring(local.max_gpu_workers) },
        # the high-water mark publish raises and every signer checks (base/highwater.py)
        { name = "EDGEQA_HIGH_WATER_URI", value = local.high_water_uri },
      ]
      # the head runs those jobs' drivers and schedules; no task or actor lands on it (no CPU
      # slot): the night's model work runs on the GPU workers
      rayStartParams = { "num-cpus" = "0", "dashboard-host" = "0.0.0.0" }
      resources = {
        limits   = { cpu = "2", memory = "8Gi" }
        requests = { cpu = "2", memory = "8Gi" }
      }
      nodeSelector       = local.system_selector
      podSecurityContext = local.pod_security_context
      securityContext    = local.container_security_context
    }
    worker = {
      groupName          = "gpu"
      replicas           = 0
      minReplicas        = 0
      maxReplicas        = local.max_gpu_workers
      serviceAccountName = local.service_account
      # one GPU per worker pod: one actor, one engine per GPU
      resources = {
        limits   = { cpu = var.worker_cpu, memory = var.worker_memory, "nvidia.com/gpu" = 1 }
        requests = { cpu = var.worker_cpu, memory = var.worker_memory, "nvidia.com/gpu" = 1 }
      }
      nodeSelector       = local.gpu_selector
      tolerations        = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]
      podSecurityContext = local.pod_security_context
      securityContext    = local.container_security_context
    }
    # the CPU workers: one large pod a node, from zero; a job asking for the custom resource
    # cpu_worker runs its driver there (the DAG's mine, build and validate). Their own service
    # account and role (ray_cpu): what those drivers write, nothing the head alone may
    additionalWorkerGroups = {
      cpu = {
        disabled           = false
        replicas           = 0
        minReplicas        = 0
        maxReplicas        = var.cpu_max_nodes
        serviceAccountName = local.cpu_service_account
        rayStartParams = {
          # no Ray CPU slot: no Ray task or actor of another job lands on the cores the
          # driver's DuckDB, FAISS and processes use (the pod's cores are the driver's)
          "num-cpus" = "0"
          # KubeRay hands this to `ray start --resources` as it is: a JSON object, quoted
          resources = jsonencode(jsonencode(local.cpu_worker_resource))
        }
        # what the drivers run here need, beside every pod's settings (common):
        containerEnv = [
          # mine embeds the night's new wordings on the GPU workers: its pool's ceiling
          { name = "EDGEQA_RAY_WORKERS", value = tostring(local.max_gpu_workers) },
          # DuckDB's budget: the window's rows reduced without spilling (docs/capacity.md)
          { name = "EDGEQA_MINING_MEMORY_MB", value = tostring(var.cpu_mining_memory_mb) },
          # the pointer, the parent release and the revocation list verified without KMS
          { name = "EDGEQA_RELEASE_PUBLIC_KEYS", value = var.release_public_keys },
          # and against the high-water mark (read only here)
          { name = "EDGEQA_HIGH_WATER_URI", value = local.high_water_uri },
          # a Ray Job's driver inherits OMP_NUM_THREADS=1 from Ray's job supervisor (an actor
          # with no CPU) unless it is set: FAISS and torch would run one thread
          { name = "OMP_NUM_THREADS", value = tostring(var.cpu_worker_cpu) },
        ]
        resources = {
          limits   = { cpu = tostring(var.cpu_worker_cpu), memory = var.cpu_worker_memory }
          requests = { cpu = tostring(var.cpu_worker_cpu), memory = var.cpu_worker_memory }
        }
        nodeSelector       = local.cpu_selector
        tolerations        = [{ key = "edgeqa.io/pool", operator = "Equal", value = "cpu", effect = "NoSchedule" }]
        podSecurityContext = local.pod_security_context
        securityContext    = local.container_security_context
      }
    }
  })]

  depends_on = [
    helm_release.kuberay_operator,
    kubernetes_service_account_v1.ray,
    kubernetes_service_account_v1.head,
    kubernetes_service_account_v1.cpu,
  ]
}

# the head's ports on every CPU node, for the NLB (selects the head pod KubeRay creates)
resource "kubernetes_service_v1" "head" {
  metadata {
    name      = "${local.ray_cluster}-head-nlb"
    namespace = kubernetes_namespace_v1.ray.metadata[0].name
  }
  spec {
    type                    = "NodePort"
    external_traffic_policy = "Cluster"
    selector = {
      "ray.io/cluster"   = local.ray_cluster
      "ray.io/node-type" = "head"
    }
    dynamic "port" {
      for_each = local.head_ports
      content {
        name        = port.key
        port        = port.value.port
        target_port = port.value.port
        node_port   = port.value.node_port
        protocol    = "TCP"
      }
    }
  }
}

# -- IAM --------------------------------------------------------------------------------------------

data "aws_iam_policy_document" "cluster_assume" {
  statement {
    actions = ["sts:AssumeRole", "sts:TagSession"]
    principals {
      type        = "Service"
      identifiers = ["eks.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "cluster" {
  name               = "${var.name}-cluster"
  assume_role_policy = data.aws_iam_policy_document.cluster_assume.json
}

resource "aws_iam_role_policy_attachment" "cluster" {
  role       = aws_iam_role.cluster.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy"
}

data "aws_iam_policy_document" "node_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "node" {
  name               = "${var.name}-node"
  assume_role_policy = data.aws_iam_policy_document.node_assume.json
}

# what a node needs to join, to give pods VPC addresses and to pull images; no store access
resource "aws_iam_role_policy_attachment" "node" {
  for_each = toset([
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
  ])
  role       = aws_iam_role.node.name
  policy_arn = each.value
}

# IRSA: each service account assumes its own role, nothing else may
data "aws_iam_policy_document" "irsa" {
  for_each = local.service_accounts
  statement {
    actions = ["sts:AssumeRoleWithWebIdentity"]
    principals {
      type        = "Federated"
      identifiers = [aws_iam_openid_connect_provider.cluster.arn]
    }
    condition {
      test     = "StringEquals"
      variable = "${local.oidc_issuer}:sub"
      values   = ["system:serviceaccount:${each.value}"]
    }
    condition {
      test     = "StringEquals"
      variable = "${local.oidc_issuer}:aud"
      values   = ["sts.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "irsa" {
  for_each           = local.service_accounts
  name               = "${var.name}-${each.key}"
  assume_role_policy = data.aws_iam_policy_document.irsa[each.key].json
}

# the GPU workers (the model actors): read the request logs, the model weights (models/, read
# only) and the work areas (<profile>/work/<run>/: the mined questions, the parent's reused
# answers), write generation checkpoints into them; releases, answer objects, pointers and
# signing stay with the drivers' roles (ray_cpu, ray_head: below), and so do the caches across
# nights (<profile>/work/cache/: mine's driver writes them, on a CPU worker;
# precompute/nightcache.py), which an actor may read but never write
data "aws_iam_policy_document" "ray" {
  statement {
    # a day's folder's Parquet files (S3 has no one-segment wildcard: '*' also spans '/', and the
    # log reader takes the files directly in the folder only, base/logreader.py); only the edge
    # and the origin write under logs/
    sid       = "ReadRequestLogs"
    actions   = ["s3:GetObject"]
    resources = ["${var.bucket_arn}/${local.log_files}"]
  }
  dynamic "statement" {
    # the deployed profiles' work areas, each named: never */work/* (which also matches
    # logs/dt=<day>/work/..., another prefix's work/, a profile not deployed)
    for_each = toset(var.profiles)
    content {
      actions   = ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"]
      resources = ["${var.bucket_arn}/${statement.value}/work/*"]
    }
  }
  statement {
    sid       = "NoWritesToTheNightCaches"
    effect    = "Deny"
    actions   = ["s3:PutObject", "s3:AbortMultipartUpload"]
    resources = ["${var.bucket_arn}/*/work/cache/*"]
  }
  statement {
    # the model weights (EDGEQA_VLLM_MODEL under models/): read only, nothing on the fleet writes them
    sid       = "ReadModels"
    actions   = ["s3:GetObject"]
    resources = ["${var.bucket_arn}/models/*"]
  }
  statement {
    sid       = "ListLogsAndModels"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["logs/*", "models/*"]
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
        values   = ["${statement.value}/work/*"]
      }
    }
  }
  statement {
    sid       = "UseStoreKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
  }
}

resource "aws_iam_role_policy" "ray" {
  name   = "${var.name}-ray"
  role   = aws_iam_role.irsa["ray"].id
  policy = data.aws_iam_policy_document.ray.json
}

# the head: generate's, publish's and prune's drivers run here (and every stage's where the DAG
# is not given EDGEQA_RAY_CPU_RESOURCE: a cluster without CPU workers). mine reads the logs and
# writes the work area; build writes the release where it is served (<profile>/releases/<version>/ and the
# answer objects the parent lacks, <profile>/a/: conditional writes, never overwriting) and reads
# the parent release and the revocation list (<profile>/revocations.json); validate reads it
# back; publish signs the release and the pointer with the release key and flips
# <profile>/current.json (a conditional write); prune deletes old releases, work areas and the
# answer objects no kept release holds (DeleteObjects). Object names: base/release.py,
# base/answer_objects.py, precompute/workarea.py, precompute/revocations.py.
data "aws_iam_policy_document" "ray_head" {
  statement {
    sid       = "ReadRequestLogs"
    actions   = ["s3:GetObject"]
    resources = ["${var.bucket_arn}/${local.log_files}"]
  }
  dynamic "statement" {
    # per deployed profile: its work areas, releases and answer objects (build stages, publish
    # uploads and reads back, prune deletes) and its pointer (the conditional flip); its
    # revocation list read only (revoking is an operator's act: edgeqa release revoke)
    for_each = toset(var.profiles)
    content {
      actions = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
      resources = [
        "${var.bucket_arn}/${statement.value}/work/*",
        "${var.bucket_arn}/${statement.value}/releases/*",
        "${var.bucket_arn}/${statement.value}/a/*",
      ]
    }
  }
  dynamic "statement" {
    for_each = toset(var.profiles)
    content {
      actions   = ["s3:GetObject", "s3:PutObject"]
      resources = ["${var.bucket_arn}/${statement.value}/current.json"]
    }
  }
  dynamic "statement" {
    for_each = toset(var.profiles)
    content {
      actions   = ["s3:GetObject"]
      resources = ["${var.bucket_arn}/${statement.value}/revocations.json"]
    }
  }
  statement {
    # the model's config and tokenizer (a release's profile names the checkpoint): read only
    sid       = "ReadModels"
    actions   = ["s3:GetObject"]
    resources = ["${var.bucket_arn}/models/*"]
  }
  statement {
    # keys only, unconditioned: S3 answers a missing object with 404 (a profile's first pointer
    # or revocation list) only to a caller that may list the bucket, 403 otherwise
    sid       = "ListStore"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arn]
  }
  statement {
    sid       = "UseStoreKey"
    actions   = ["kms:Decrypt", "kms:DescribeKey", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
  }
  statement {
    sid       = "SignReleases"
    actions   = ["kms:Sign", "kms:GetPublicKey"]
    resources = [var.signing_key_arn]
  }
  statement {
    # the high-water mark: raised after each pointer it signs (a conditional UpdateItem: never
    # lowered), read before it signs on top of what the store holds
    sid       = "RaiseHighWaterMark"
    actions   = ["dynamodb:GetItem", "dynamodb:UpdateItem"]
    resources = [var.high_water_table_arn]
  }
}

resource "aws_iam_role_policy" "ray_head" {
  name   = "${var.name}-ray-head"
  role   = aws_iam_role.irsa["ray_head"].id
  policy = data.aws_iam_policy_document.ray_head.json
}

# the CPU workers: mine's, build's and validate's drivers (Ray Jobs that ask for cpu_worker) and
# their CPU tasks. What the GPU workers may do, and what those three stages write beyond it:
# mine the caches across nights (<profile>/work/cache/<kind>/<fingerprint>/<night>/..., and it
# deletes the parts of nights before its window: precompute/nightcache.py); build the release
# where it is served (<profile>/releases/<version>/...: conditional writes, a stopped upload's
# leftovers cleared: precompute/publish.py) and the answer objects the parent lacks
# (<profile>/a/<hh>/...: created, never overwritten nor deleted: S3's If-None-Match, required
# here); validate the release's checked.json or refused.json (precompute/prune.py). They read the
# pointer and the revocation list (the parent release, what is revoked: verified with
# EDGEQA_RELEASE_PUBLIC_KEYS) and may write neither (denied), sign nothing (denied), delete no
# answer object and no run's work area: publish and prune stay on the head.
data "aws_iam_policy_document" "ray_cpu" {
  statement {
    sid       = "ReadRequestLogs"
    actions   = ["s3:GetObject"]
    resources = ["${var.bucket_arn}/${local.log_files}"]
  }
  dynamic "statement" {
    # per deployed profile: the runs' work areas and the caches across nights (mine, build's
    # built.json); mine expires the caches' parts of nights before its window (nothing else in a
    # work area is deleted from here); build uploads the release (and clears a stopped upload's
    # leftovers), validate marks it checked.json or refused.json, mine and validate read the
    # parent release; build checks the answer objects there, validate reads sampled ones back
    for_each = toset(var.profiles)
    content {
      actions   = ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"]
      resources = ["${var.bucket_arn}/${statement.value}/work/*"]
    }
  }
  dynamic "statement" {
    for_each = toset(var.profiles)
    content {
      actions   = ["s3:DeleteObject"]
      resources = ["${var.bucket_arn}/${statement.value}/work/cache/*"]
    }
  }
  dynamic "statement" {
    for_each = toset(var.profiles)
    content {
      actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
      resources = ["${var.bucket_arn}/${statement.value}/releases/*"]
    }
  }
  dynamic "statement" {
    # read: the answer objects, the pointer the night builds on, what is revoked
    for_each = toset(var.profiles)
    content {
      actions = ["s3:GetObject"]
      resources = [
        "${var.bucket_arn}/${statement.value}/a/*",
        "${var.bucket_arn}/${statement.value}/current.json",
        "${var.bucket_arn}/${statement.value}/revocations.json",
      ]
    }
  }
  dynamic "statement" {
    # the answer objects the parent lacks, created only (Store.put_new: If-None-Match: *): a
    # served answer is never replaced from here
    for_each = toset(var.profiles)
    content {
      actions   = ["s3:PutObject"]
      resources = ["${var.bucket_arn}/${statement.value}/a/*"]
      condition {
        test     = "Null"
        variable = "s3:if-none-match"
        values   = ["false"]
      }
    }
  }
  statement {
    sid       = "ReadModels"
    actions   = ["s3:GetObject"]
    resources = ["${var.bucket_arn}/models/*"]
  }
  statement {
    # keys only, unconditioned: S3 answers a missing object with 404 (a profile's first pointer
    # or revocation list) only to a caller that may list the bucket, 403 otherwise
    sid       = "ListStore"
    actions   = ["s3:ListBucket"]
    resources = [var.bucket_arn]
  }
  statement {
    sid       = "UseStoreKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]
  }
  statement {
    # the high-water mark: the pointer and the revocation list it reads are checked against it
    sid       = "ReadHighWaterMark"
    actions   = ["dynamodb:GetItem"]
    resources = [var.high_water_table_arn]
  }
  statement {
    # publishing is the head's: whatever is granted above or later, never from here
    sid     = "NeverPointersOrRevocations"
    effect  = "Deny"
    actions = ["s3:PutObject", "s3:DeleteObject"]
    resources = [
      "${var.bucket_arn}/*/current.json",
      "${var.bucket_arn}/*/revocations.json",
    ]
  }
  statement {
    sid       = "NeverSigns"
    effect    = "Deny"
    actions   = ["kms:Sign"]
    resources = [var.signing_key_arn]
  }
}

resource "aws_iam_role_policy" "ray_cpu" {
  name   = "${var.name}-ray-cpu"
  role   = aws_iam_role.irsa["ray_cpu"].id
  policy = data.aws_iam_policy_document.ray_cpu.json
}

# the Cluster Autoscaler: see every group, resize and shrink this cluster's own only
data "aws_iam_policy_document" "autoscaler" {
  statement {
    sid = "DescribeGroups"
    actions = [
      "autoscaling:DescribeAutoScalingGroups",
      "autoscaling:DescribeAutoScalingInstances",
      "autoscaling:DescribeLaunchConfigurations",
      "autoscaling:DescribeScalingActivities",
      "autoscaling:DescribeTags",
      "ec2:DescribeImages",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeLaunchTemplateVersions",
      "ec2:GetInstanceTypesFromInstanceRequirements",
    ]
    resources = ["*"] # these calls have no resource-level permissions
  }
  statement {
    sid       = "DescribeNodeGroups" # scale from zero: a group's labels, taints and instance type
    actions   = ["eks:DescribeNodegroup"]
    resources = concat([aws_eks_node_group.system.arn], [for group in values(local.worker_groups) : group.arn])
  }
  statement {
    sid     = "ResizeTheseGroups"
    actions = ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"]
    resources = [
      for group in concat([aws_eks_node_group.system], values(local.worker_groups)) :
      "arn:aws:autoscaling:${var.region}:${var.account_id}:autoScalingGroup:*:autoScalingGroupName/${group.resources[0].autoscaling_groups[0].name}"
    ]
  }
}

resource "aws_iam_role_policy" "autoscaler" {
  name   = "${var.name}-autoscaler"
  role   = aws_iam_role.irsa["autoscaler"].id
  policy = data.aws_iam_policy_document.autoscaler.json
}
