# edgeqa on AWS: the store (S3), the CDN (CloudFront), the origin (GPU Auto Scaling group behind an
# ALB), the edge index service (ECS Fargate, one module instance per region), the nightly DAG
# (MWAA) and its fleet (a Ray cluster on EKS whose GPU and CPU workers scale from zero, spot first). Every module takes
# only what it needs; IAM is least privilege per deployable.

locals {
  name = "edgeqa-${var.environment}"
}

data "aws_caller_identity" "current" {}

module "storage" {
  source     = "./modules/storage"
  name       = local.name
  account_id = data.aws_caller_identity.current.account_id
}

module "signing" {
  source      = "./modules/signing"
  name        = local.name
  account_id  = data.aws_caller_identity.current.account_id
  kms_key_arn = module.storage.kms_key_arn
  # who may raise the high-water mark: the roles that sign (publish's driver, on the Ray head;
  # the operators' that revoke and roll back)
  high_water_writer_role_arns = concat([module.ray.head_role_arn], var.release_operator_role_arns)
}

module "origin" {
  source                   = "./modules/origin"
  name                     = "${local.name}-origin"
  vpc_id                   = var.vpc_id
  public_subnet_ids        = var.public_subnet_ids
  private_subnet_ids       = var.private_subnet_ids
  certificate_arn          = var.certificate_arn
  ami_id                   = var.origin_ami_id
  instance_type            = var.origin_instance_type
  min_size                 = var.origin_min_size
  max_size                 = var.origin_max_size
  target_waiting           = var.origin_target_waiting
  bucket_arn               = module.storage.bucket_arn
  kms_key_arn              = module.storage.kms_key_arn
  access_logs_bucket       = module.storage.access_logs_bucket
  profiles                 = var.profiles
  region                   = var.region
  high_water_table_name    = module.signing.high_water_table_name
  high_water_table_arn     = module.signing.high_water_table_arn
  user_salt_secret_arn     = var.user_salt_secret_arn
  api_keys_secret_arn      = var.api_keys_secret_arn
  identity_secret_arn      = var.identity_secret_arn
  release_public_keys      = module.signing.public_key
  origin_verify_secret_arn = var.origin_verify_secret_arn
}

module "edge" {
  source                   = "./modules/edge"
  name                     = "${local.name}-edge"
  region                   = var.region
  vpc_id                   = var.vpc_id
  public_subnet_ids        = var.public_subnet_ids
  private_subnet_ids       = var.private_subnet_ids
  certificate_arn          = var.certificate_arn
  image                    = var.edge_image
  desired_count            = var.edge_desired_count
  bucket_arn               = module.storage.bucket_arn
  bucket_name              = module.storage.bucket_name
  kms_key_arn              = module.storage.kms_key_arn
  access_logs_bucket       = module.storage.access_logs_bucket
  profiles                 = var.profiles
  high_water_table_name    = module.signing.high_water_table_name
  high_water_table_arn     = module.signing.high_water_table_arn
  user_salt_secret_arn     = var.user_salt_secret_arn
  identity_secret_arn      = var.identity_secret_arn
  release_public_keys      = module.signing.public_key
  log_retention_days       = var.log_retention_days
  origin_verify_secret_arn = var.origin_verify_secret_arn
}

module "cdn" {
  source = "./modules/cdn"
  providers = {
    aws           = aws
    aws.us_east_1 = aws.us_east_1
  }
  name                     = local.name
  bucket_name              = module.storage.bucket_name
  bucket_arn               = module.storage.bucket_arn
  bucket_domain_name       = module.storage.bucket_regional_domain_name
  kms_key_arn              = module.storage.kms_key_arn
  access_logs_bucket       = module.storage.access_logs_bucket_domain_name
  origin_domain_name       = module.origin.alb_dns_name
  edge_domain_name         = module.edge.alb_dns_name
  aliases                  = var.aliases
  certificate_arn          = var.cloudfront_certificate_arn
  origin_verify_secret_arn = var.origin_verify_secret_arn
  ipv6_enabled             = var.cloudfront_ipv6
  profiles                 = var.profiles
}

module "airflow" {
  source             = "./modules/airflow"
  name               = "${local.name}-airflow"
  account_id         = data.aws_caller_identity.current.account_id
  region             = var.region
  vpc_id             = var.vpc_id
  private_subnet_ids = slice(var.private_subnet_ids, 0, 2)
  kms_key_arn        = module.storage.kms_key_arn
  # the DAG's settings: the Jobs API its tasks submit their stages to (EDGEQA_RAY_JOBS_ADDRESS)
  # and the Ray resource mine's, build's and validate's jobs ask for, so that their drivers run
  # on a CPU worker (EDGEQA_RAY_CPU_RESOURCE)
  ray_jobs_address = module.ray.dashboard_address
  ray_cpu_resource = module.ray.cpu_worker_resource
  bucket_name      = module.storage.bucket_name
  # the DAG and the project's packages it imports (uploaded to the DAG bucket)
  source_root = "${path.root}/../.."
}

module "ray" {
  source             = "./modules/ray"
  name               = "${local.name}-ray"
  account_id         = data.aws_caller_identity.current.account_id
  region             = var.region
  vpc_id             = var.vpc_id
  private_subnet_ids = var.private_subnet_ids
  api_cidr_blocks    = var.ray_api_cidr_blocks
  # only the DAG's workers reach the head (the Jobs API)
  client_security_group_ids = [module.airflow.security_group_id]
  image                     = var.ray_image
  ray_version               = var.ray_version
  gpu_instance_types        = var.ray_gpu_instance_types
  gpu_max_nodes             = var.ray_gpu_max_nodes
  cpu_instance_types        = var.ray_cpu_instance_types
  cpu_max_nodes             = var.ray_cpu_max_nodes
  generation_engine         = var.generation_engine
  vllm_model                = var.vllm_model
  vllm_quantization         = var.vllm_quantization
  bucket_arn                = module.storage.bucket_arn
  bucket_name               = module.storage.bucket_name
  kms_key_arn               = module.storage.kms_key_arn
  # publish's driver on the head signs releases and pointers (the workers cannot); the CPU
  # workers' drivers verify what they read with the public half
  signing_key_arn     = module.signing.key_arn
  release_public_keys = module.signing.public_key
  log_retention_days  = var.log_retention_days
  # the profiles its roles may write (per profile, never */...), and the high-water mark the
  # head raises and the CPU workers read
  profiles              = var.profiles
  high_water_table_name = module.signing.high_water_table_name
  high_water_table_arn  = module.signing.high_water_table_arn
}
