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

variable "gpu_instance_type" {
  description = "Instance type of the GPU node group, a g5 (A10G, 24 GB): g5.xlarge has one GPU, so one Ray worker and one actor."
  type        = string
  default     = "g5.xlarge"
  validation {
    condition     = can(regex("^g5\\.(xlarge|2xlarge|4xlarge|8xlarge|12xlarge|16xlarge|24xlarge|48xlarge)$", var.gpu_instance_type))
    error_message = "gpu_instance_type must be a g5 size (A10G GPUs)."
  }
}

variable "gpu_max_nodes" {
  description = "Most GPU nodes a night may use; the group scales from zero to this and back."
  type        = number
  default     = 4
  validation {
    condition     = var.gpu_max_nodes >= 1
    error_message = "gpu_max_nodes must be at least 1."
  }
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
