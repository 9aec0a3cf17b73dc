variable "region" {
  description = "AWS region of the store, the origins, the edge service, MWAA and the Ray cluster."
  type        = string
  default     = "eu-west-1"
}

variable "environment" {
  description = "Name of this deployment (prod, staging...); part of every resource name."
  type        = string
  default     = "prod"
}

variable "vpc_id" {
  description = "VPC for the origin, the edge service, MWAA and the Ray cluster."
  type        = string
}

variable "public_subnet_ids" {
  description = "Subnets of the internet-facing load balancers (two or more AZs)."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Subnets of the origin instances, the edge tasks, MWAA and the Ray cluster (two or more AZs)."
  type        = list(string)
}

variable "certificate_arn" {
  description = "ACM certificate (in var.region) of the load balancers' HTTPS listeners."
  type        = string
}

variable "cloudfront_certificate_arn" {
  description = "ACM certificate in us-east-1 for the CloudFront aliases."
  type        = string
}

variable "cloudfront_ipv6" {
  description = "CloudFront serves viewers over IPv6 too; false: IPv4 only, where the WAF's per-IP rate limit holds per host (WAF counts each IPv6 address apart)."
  type        = bool
  default     = true
}

variable "aliases" {
  description = "Domain names CloudFront answers for (the certificate must cover them)."
  type        = list(string)
}

variable "origin_ami_id" {
  description = "AMI of the origin instances: a GPU (NVIDIA driver) image with edgeqa installed, starting `edgeqa origin serve`."
  type        = string
}

variable "origin_instance_type" {
  description = "Origin instance type: g5.xlarge has one A10 (24 GB)."
  type        = string
  default     = "g5.xlarge"
}

variable "origin_min_size" {
  description = "Fewest origin instances."
  type        = number
  default     = 1
}

variable "origin_max_size" {
  description = "Most origin instances."
  type        = number
  default     = 8
}

variable "origin_target_waiting" {
  description = "Target of the scaling policy: requests waiting for a slot per instance (vllm:num_requests_waiting)."
  type        = number
  default     = 8
}

variable "edge_image" {
  description = "Container image of the edge service (`edgeqa edge serve`)."
  type        = string
}

variable "edge_desired_count" {
  description = "Edge service tasks per region."
  type        = number
  default     = 2
}

variable "profiles" {
  description = "The release profiles the deployment builds and serves, by name (<model>-<language>-<10 hex>, as `edgeqa` names them: one per language): EDGEQA_PROFILE of the edge and the origin, and the only profiles any role may read or write in the store (per profile, never */...). A new profile (another model, prompt or embedder) is added here, and applied, before the night that builds it."
  type        = list(string)
  validation {
    condition = length(var.profiles) > 0 && alltrue([
      for p in var.profiles : can(regex("^[a-z0-9][a-z0-9-]{0,127}$", p)) && !contains(["logs", "models"], p)
    ])
    error_message = "Each profile is a name of lowercase letters, digits and '-' (not logs or models: the store's other prefixes)."
  }
}

variable "release_operator_role_arns" {
  description = "Roles of the operators who sign by hand (edgeqa release revoke/rollback: they need kms:Sign on the release key, granted outside this configuration) and so may raise the high-water mark; no other principal but the Ray head's role may write it."
  type        = list(string)
  default     = []
}

variable "user_salt_secret_arn" {
  description = "Secrets Manager secret holding EDGEQA_USER_SALT (the same on every origin and edge)."
  type        = string
}

variable "log_retention_days" {
  description = "Days CloudWatch keeps the services' logs."
  type        = number
  default     = 400
}

variable "origin_verify_secret_arn" {
  description = "Secrets Manager secret holding a random value (32+ characters) CloudFront sends to both load balancers as x-edgeqa-origin-verify; a request without it is refused, so nothing reaches the services around CloudFront and its WAF. Terraform reads it (secretsmanager:GetSecretValue for whoever applies); no instance or task role may."
  type        = string
}

variable "identity_secret_arn" {
  description = "Secrets Manager secret holding EDGEQA_IDENTITY_SECRET (32+ characters): the HS256 key your backend mints user tokens with (base.users.mint_user_token) and the edge and the origin verify them with."
  type        = string
}

variable "api_keys_secret_arn" {
  description = "Secrets Manager secret holding EDGEQA_API_KEYS (comma-separated, 16+ characters each): the keys the origin's /v1/* accepts; each key is one asker with its own share (in flight, tokens a minute)."
  type        = string
}

variable "ray_image" {
  description = "The project's image with vLLM (the top-level Dockerfile's gpu target: --target gpu --build-arg EXTRAS=gpu) as <repository>:<tag>: the Ray head and workers run it."
  type        = string
}

variable "ray_version" {
  description = "The Ray version in ray_image (the RayCluster's rayVersion); the Airflow workers submit jobs over HTTP, so theirs need not match."
  type        = string
  default     = "2.60.0"
}

variable "ray_gpu_instance_types" {
  description = "Instance types of the Ray GPU workers' node groups (spot, with on-demand as the fallback), one GPU each: g5 (A10G) sizes, or g6 (L4) where the region sells them; smallest first. docs/capacity.md's machine table names them."
  type        = list(string)
  default     = ["g5.xlarge", "g5.2xlarge", "g5.4xlarge"]
}

variable "ray_gpu_max_nodes" {
  description = "Most GPU nodes a night may use, spot and on-demand together (the plan's ceiling, docs/capacity.md); the groups scale from zero to this and back to zero."
  type        = number
  default     = 80
}

variable "ray_cpu_instance_types" {
  description = "Instance types of the Ray CPU workers' node groups (spot, with on-demand as the fallback), where mine's, build's and validate's drivers run: 192 vCPU and 1,536 GiB (the worker pod and DuckDB's budget are sized for it, docs/capacity.md); the first is the Cluster Autoscaler's template."
  type        = list(string)
  default     = ["r7i.48xlarge", "r6a.48xlarge"]
}

variable "ray_cpu_max_nodes" {
  description = "Most CPU worker nodes, spot and on-demand together: one per language DAG running at once."
  type        = number
  default     = 2
}

variable "generation_engine" {
  description = "EDGEQA_GENERATION_ENGINE of the Ray pods: vllm (vLLM on the GPU workers, what docs/capacity.md prices) or edgeqa (the project's own engine)."
  type        = string
  default     = "vllm"
}

variable "vllm_model" {
  description = "EDGEQA_VLLM_MODEL of the Ray pods: a checkpoint folder under s3://<store>/models/ (copy it there once; the Ray pods read it, nothing writes it), or a full s3:// URI or a folder in the image."
  type        = string
  default     = "Meta-Llama-3.1-8B-Instruct-quantized.w8a8"
}

variable "vllm_quantization" {
  description = "EDGEQA_VLLM_QUANTIZATION of the Ray pods: w8a8 (an INT8 W8A8 compressed-tensors checkpoint, the default model) or fp16."
  type        = string
  default     = "w8a8"
}

variable "ray_api_cidr_blocks" {
  description = "Who may reach the Ray cluster's private Kubernetes API (where terraform apply and kubectl run). Empty: the VPC's CIDR."
  type        = list(string)
  default     = []
}
