output "store_uri" {
  description = "EDGEQA_STORE for the origin, the edge service and the DAG."
  value       = "s3://${module.storage.bucket_name}"
}

output "cdn_domain_name" {
  description = "CloudFront domain: releases under /<profile>/releases/, the API under /v1/."
  value       = module.cdn.domain_name
}

output "origin_alb_dns_name" {
  description = "The origin load balancer (reached through CloudFront)."
  value       = module.origin.alb_dns_name
}

output "edge_alb_dns_name" {
  description = "The edge service load balancer of this region."
  value       = module.edge.alb_dns_name
}

output "mwaa_webserver_url" {
  description = "The Airflow UI (private: reach it from the VPC)."
  value       = module.airflow.webserver_url
}

output "mwaa_dags_bucket" {
  description = "MWAA's bucket: the DAG, the packages it imports, requirements.txt and the startup script, all uploaded by this apply."
  value       = module.airflow.dags_bucket
}

output "release_public_key" {
  description = "The release signing key's public half (base64 DER): EDGEQA_RELEASE_PUBLIC_KEYS for anything that reads releases, and releasePublicKeys of the web client (the origin's /config.json serves it)."
  value       = module.signing.public_key
}

output "ray_dashboard_address" {
  description = "The Ray Jobs API and dashboard (http://<internal NLB>:8265), reachable from the MWAA workers only, handed to them as EDGEQA_RAY_JOBS_ADDRESS."
  value       = module.ray.dashboard_address
}

output "ray_cluster_name" {
  description = "The Ray cluster's EKS cluster (private API: aws eks update-kubeconfig from inside the VPC)."
  value       = module.ray.cluster_name
}

output "vllm_model" {
  description = "Where the Ray GPU workers load the model from (EDGEQA_VLLM_MODEL): copy the checkpoint there once (aws s3 sync)."
  value       = module.ray.vllm_model
}
