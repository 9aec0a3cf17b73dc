variable "name" {
  description = "Name of the EKS cluster and a prefix of the Ray fleet's other resources."
  type        = string
}

variable "account_id" {
  description = "AWS account id."
  type        = string
}

variable "region" {
  description = "Region of the cluster (the Cluster Autoscaler's and the Ray pods' AWS region)."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the cluster, its nodes and the Ray head's internal NLB."
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets (two or more AZs) of the control plane's ENIs, the nodes and the NLB."
  type        = list(string)
}

variable "api_cidr_blocks" {
  description = "Who may reach the private Kubernetes API (443): where terraform apply and kubectl run. Empty: the VPC's CIDR."
  type        = list(string)
  default     = []
}

variable "client_security_group_ids" {
  description = "Security groups allowed to reach the Ray head's Jobs API (8265): the Airflow workers'."
  type        = list(string)
}

variable "kubernetes_version" {
  description = "EKS Kubernetes version; the Cluster Autoscaler's image follows its minor."
  type        = string
  default     = "1.35"
}

variable "system_instance_type" {
  description = "Instance type of the CPU node group (one node: the Ray head, KubeRay, the Cluster Autoscaler)."
  type        = string
  default     = "m6i.xlarge"
}

variable "gpu_instance_types" {
  description = "Instance types of the GPU node groups (a spot group and its on-demand fallback), one GPU each: g5 (A10G) or g6 (L4) sizes with a single GPU. The first is the Cluster Autoscaler's template while a group has no node, so list the smallest first: every worker pod must fit it. g6 is not sold in every region (eu-west-1 has g5 only)."
  type        = list(string)
  default     = ["g5.xlarge", "g5.2xlarge", "g5.4xlarge"]
  validation {
    condition = length(var.gpu_instance_types) > 0 && alltrue([
      for t in var.gpu_instance_types : can(regex("^g[56]\\.(xlarge|2xlarge|4xlarge|8xlarge|16xlarge)$", t))
    ])
    error_message = "gpu_instance_types must be single-GPU g5 (A10G) or g6 (L4) sizes: xlarge, 2xlarge, 4xlarge, 8xlarge or 16xlarge (every node the same GPU count, one Ray worker per GPU)."
  }
}

variable "gpu_max_nodes" {
  description = "Most GPU nodes (one GPU each) a night may use, spot and on-demand together: the ceiling docs/capacity.md sizes. Each group scales from zero to this and back; Ray's autoscaler never asks for more workers than this many GPUs."
  type        = number
  default     = 80
  validation {
    condition     = var.gpu_max_nodes >= 1
    error_message = "gpu_max_nodes must be at least 1."
  }
}

variable "cpu_instance_types" {
  description = "Instance types of the CPU worker node groups (a spot group and its on-demand fallback) that run the nightly job's CPU work (mining, build, publish): large-memory r6i/r7i of 64 vCPU and 512 GiB or more. The first is the Cluster Autoscaler's template while a group has no node: list the smallest first, the worker pod is sized to fit it."
  type        = list(string)
  default     = ["r6i.16xlarge", "r7i.16xlarge", "r6i.24xlarge", "r7i.24xlarge"]
  validation {
    condition = length(var.cpu_instance_types) > 0 && alltrue([
      for t in var.cpu_instance_types : can(regex("^r[67]i\\.(16xlarge|24xlarge|32xlarge)$", t))
    ])
    error_message = "cpu_instance_types must be r6i or r7i sizes of 64 vCPU and 512 GiB or more (16xlarge, 24xlarge, 32xlarge): the CPU worker pod is sized for a 16xlarge."
  }
}

variable "cpu_max_nodes" {
  description = "Most CPU worker nodes (one Ray CPU worker each), spot and on-demand together: one per language DAG running at once. The groups scale from zero."
  type        = number
  default     = 2
  validation {
    condition     = var.cpu_max_nodes >= 1
    error_message = "cpu_max_nodes must be at least 1."
  }
}

variable "cpu_worker_cpu" {
  description = "CPUs of the Ray CPU worker pod (request, limit and its Ray num-cpus), one per node: fits an r6i/r7i.16xlarge (64 vCPU) beside the node's daemons."
  type        = number
  default     = 60
}

variable "cpu_worker_memory" {
  description = "Memory of the Ray CPU worker pod (request and limit, a Kubernetes quantity): fits a 512 GiB node beside its daemons. DuckDB's budget (EDGEQA_MINING_MEMORY_MB) must stay below it."
  type        = string
  default     = "480Gi"
}

variable "cpu_volume_size" {
  description = "GiB of each CPU worker node's root volume (gp3): DuckDB's spill, the window's wordings database, the vectors clustering waits on (docs/capacity.md sizes it)."
  type        = number
  default     = 2000
}

variable "cpu_volume_throughput" {
  description = "MiB/s provisioned on each CPU worker node's gp3 volume (125 to 1000): DuckDB spills and reads back through it."
  type        = number
  default     = 1000
}

variable "gpu_volume_size" {
  description = "GiB of each GPU node's data volume (container images: the project's image carries torch with CUDA)."
  type        = number
  default     = 100
}

variable "worker_cpu" {
  description = "CPU of each Ray GPU worker pod (request and limit), one per GPU: fits a g5.xlarge beside the node's daemons."
  type        = string
  default     = "3"
}

variable "worker_memory" {
  description = "Memory of each Ray GPU worker pod (request and limit, a Kubernetes quantity)."
  type        = string
  default     = "12Gi"
}

variable "idle_timeout_seconds" {
  description = "Seconds a Ray worker stays without work before Ray's autoscaler removes it (its node follows about 5 minutes later)."
  type        = number
  default     = 300
}

variable "image" {
  description = "The project's image (the top-level Dockerfile, built with the gpu extra) as <repository>:<tag>: the Ray head and workers run it."
  type        = string
  validation {
    condition     = can(regex("^[^@]+:[^:/@]+$", var.image))
    error_message = "image must be <repository>:<tag> (the ray-cluster chart takes the two apart)."
  }
}

variable "ray_version" {
  description = "The Ray version installed in the image (RayCluster rayVersion); the Airflow workers submit jobs over HTTP, so theirs need not match."
  type        = string
  default     = "2.60.0"
}

variable "bucket_arn" {
  description = "The store bucket: the GPU workers read logs/ and the work areas (<profile>/work/) and write the work areas; the head (the stages' drivers) also writes releases, current.json and the revocation list."
  type        = string
}

variable "kms_key_arn" {
  description = "The store's KMS key (the bucket's objects and the control plane's log group)."
  type        = string
}

variable "signing_key_arn" {
  description = "The release signing key (the signing module's key_arn): the head's EDGEQA_SIGNING_KMS_KEY; only the head's role may kms:Sign with it."
  type        = string
}

variable "log_retention_days" {
  description = "Days CloudWatch keeps the control plane's logs."
  type        = number
}

variable "bucket_name" {
  description = "The store bucket's name: the default EDGEQA_VLLM_MODEL is s3://<bucket_name>/models/<vllm_model>."
  type        = string
}

variable "generation_engine" {
  description = "EDGEQA_GENERATION_ENGINE of the Ray pods: vllm (vLLM on the GPU workers through Ray Data's LLM API, what docs/capacity.md prices) or edgeqa (the project's own engine)."
  type        = string
  default     = "vllm"
  validation {
    condition     = contains(["vllm", "edgeqa"], var.generation_engine)
    error_message = "generation_engine must be vllm or edgeqa."
  }
}

variable "vllm_model" {
  description = "EDGEQA_VLLM_MODEL of the Ray pods: a checkpoint's folder name under the store's models/ prefix (read-only to the Ray pods' roles; copied there once, see infra/terraform/README.md), or a full s3:// URI or a folder in the image."
  type        = string
  default     = "Meta-Llama-3.1-8B-Instruct-quantized.w8a8"
  validation {
    condition     = can(regex("^(s3://[^/]+/.+|/.+|[A-Za-z0-9][A-Za-z0-9._-]*)$", var.vllm_model))
    error_message = "vllm_model must be a folder name under models/, an s3:// URI or an absolute path."
  }
}

variable "vllm_quantization" {
  description = "EDGEQA_VLLM_QUANTIZATION of the Ray pods: w8a8 (an INT8 W8A8 compressed-tensors checkpoint) or fp16."
  type        = string
  default     = "w8a8"
  validation {
    condition     = contains(["w8a8", "fp16"], var.vllm_quantization)
    error_message = "vllm_quantization must be w8a8 or fp16."
  }
}
