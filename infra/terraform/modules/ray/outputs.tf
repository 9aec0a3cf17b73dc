output "dashboard_address" {
  description = "The Ray Jobs API and dashboard (http://<internal NLB>:8265), from the Airflow workers' security group only: the DAG's workers' EDGEQA_RAY_JOBS_ADDRESS."
  value       = "http://${aws_lb.head.dns_name}:${local.head_ports.dashboard.port}"
}

output "max_gpu_workers" {
  description = "The most GPU workers (one Ray actor each) the cluster scales to: EDGEQA_RAY_WORKERS of the stages' drivers on the head."
  value       = local.max_gpu_workers
}

output "cluster_name" {
  description = "The EKS cluster (aws eks update-kubeconfig --name ...; its API is private)."
  value       = aws_eks_cluster.this.name
}

output "cluster_endpoint" {
  description = "The EKS API's private endpoint (the helm and kubernetes providers)."
  value       = aws_eks_cluster.this.endpoint
}

output "cluster_certificate_authority" {
  description = "The EKS API's CA certificate, base64 (the helm and kubernetes providers)."
  value       = aws_eks_cluster.this.certificate_authority[0].data
}

output "worker_role_arn" {
  description = "The GPU workers' IAM role (IRSA): the store's logs, work areas and models (read only) only."
  value       = aws_iam_role.irsa["ray"].arn
}

output "cpu_role_arn" {
  description = "The CPU workers' IAM role (IRSA), mine's, build's and validate's drivers': logs, work areas and the caches across nights, releases, answer objects (created only), models; current.json and the revocation list read only; no signing."
  value       = aws_iam_role.irsa["ray_cpu"].arn
}

output "cpu_worker_resource" {
  description = "The Ray resource the CPU workers carry (one a pod): EDGEQA_RAY_CPU_RESOURCE of the DAG's tasks, whose mine, build and validate jobs ask for one so that their drivers run there."
  value       = one(keys(local.cpu_worker_resource))
}

output "head_role_arn" {
  description = "The Ray head's IAM role (IRSA), generate's, publish's and prune's drivers': work areas, releases, current.json, the revocation list, kms:Sign with the release key."
  value       = aws_iam_role.irsa["ray_head"].arn
}

output "security_group_id" {
  description = "The Ray head NLB's security group."
  value       = aws_security_group.head.id
}

output "vllm_model" {
  description = "EDGEQA_VLLM_MODEL of the Ray pods: where the GPU workers load the model from (copy the checkpoint there once)."
  value       = local.vllm_model
}
