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
  description = "Instance types of the CPU worker node groups (a spot group and its on-demand fallback) whose pods run the drivers of mine, build and validate (DuckDB, FAISS, the text rules and the k step on their cores): r6i/r7i/r6a/r7a sizes, every one at least the worker pod (cpu_worker_cpu + 4 vCPU, cpu_worker_memory within 15/16 of its memory; a precondition checks it). The first is the Cluster Autoscaler's template while a group has no node. docs/capacity.md's machine table names them."
  type        = list(string)
  default     = ["r7i.48xlarge", "r6a.48xlarge"]
  validation {
    condition = length(var.cpu_instance_types) > 0 && alltrue([
      for t in var.cpu_instance_types : can(regex("^r(6i|7i|6a|7a)\\.(16xlarge|24xlarge|32xlarge|48xlarge)$", t))
    ])
    error_message = "cpu_instance_types must be r6i, r7i, r6a or r7a sizes of 16xlarge or more (the worker pod is sized for the smallest listed)."
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
  description = "CPUs of the Ray CPU worker pod (request, limit, its Ray num-cpus and the OMP_NUM_THREADS of its processes), one per node: a 192-vCPU node less 4 for the node's daemons. The stages' processes (the text rules, the k step) and DuckDB's threads follow it (the cgroup quota)."
  type        = number
  default     = 188
  validation {
    condition     = var.cpu_worker_cpu >= 1 && floor(var.cpu_worker_cpu) == var.cpu_worker_cpu
    error_message = "cpu_worker_cpu must be a whole number of CPUs."
  }
}

variable "cpu_worker_memory" {
  description = "Memory of the Ray CPU worker pod (request and limit, in Gi): 15/16 of a 1,536 GiB node. EDGEQA_MINING_MEMORY_MB (cpu_mining_memory_mb) stays within 3/4 of it."
  type        = string
  default     = "1440Gi"
  validation {
    condition     = can(regex("^[1-9][0-9]*Gi$", var.cpu_worker_memory))
    error_message = "cpu_worker_memory must be a whole number of Gi (e.g. 1440Gi)."
  }
}

variable "cpu_mining_memory_mb" {
  description = "EDGEQA_MINING_MEMORY_MB of the CPU worker pods: DuckDB's budget while mine reduces the window (MB of 10^6 bytes), sized by docs/capacity.md so that 1B log rows do not spill (the 30M-row working set, budget and spill, ~0.82 KB a row, with 22 % to spare); at most 3/4 of the pod's memory."
  type        = number
  default     = 1000000
  validation {
    condition     = var.cpu_mining_memory_mb >= 64
    error_message = "cpu_mining_memory_mb must be at least 64 (precompute's minimum)."
  }
}

variable "cpu_volume_size" {
  description = "GiB of each CPU worker node's root volume (gp3): the window's DuckDB database and, past its budget, its spill; the vectors clustering waits on and its inverted file's lists while built (docs/capacity.md sizes it)."
  type        = number
  default     = 3000
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
  description = "The store bucket: the GPU workers read logs/ and the work areas (<profile>/work/) and write the work areas; the CPU workers (mine's, build's and validate's drivers) also write the caches across nights, the releases and the answer objects; the head (generate's, publish's and prune's drivers) also flips current.json."
  type        = string
}

variable "kms_key_arn" {
  description = "The store's KMS key (the bucket's objects and the control plane's log group)."
  type        = string
}

variable "release_public_keys" {
  description = "The release signing key's public half (the signing module's public_key): EDGEQA_RELEASE_PUBLIC_KEYS of the CPU worker pods, whose drivers verify the pointer, the parent release and the revocation list they read without any KMS access."
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

variable "profiles" {
  description = "The release profiles the nightly job builds and publishes: the fleet's roles may read and write these profiles' work areas, releases and pointers only (a night of another profile is refused: add it here first)."
  type        = list(string)
}

variable "high_water_table_name" {
  description = "The DynamoDB table of the high-water mark (EDGEQA_HIGH_WATER_URI=dynamodb://<name> of the head and the CPU workers)."
  type        = string
}

variable "high_water_table_arn" {
  description = "ARN of the high-water mark's table: the head (the signer) raises it, the CPU workers read it."
  type        = string
}
