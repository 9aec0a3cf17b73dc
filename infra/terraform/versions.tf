terraform {
  required_version = ">= 1.6"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 6.21" # 6.21: KMS Ed25519 keys (ECC_NIST_EDWARDS25519)
    }
    helm = {
      source  = "hashicorp/helm"
      version = "~> 3.1" # 3.x: `kubernetes` and `exec` are attributes
    }
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 2.36"
    }
  }
}

provider "aws" {
  region = var.region
  default_tags {
    tags = { project = "edgeqa", environment = var.environment }
  }
}

# CloudFront's WAF and certificates live in us-east-1 whatever the region
provider "aws" {
  alias  = "us_east_1"
  region = "us-east-1"
  default_tags {
    tags = { project = "edgeqa", environment = var.environment }
  }
}

# The Ray cluster's Kubernetes API (modules/ray) is private: these run where it is reachable (a
# runner in the VPC, or over a VPN into it). A token per call from the AWS CLI: nothing stored.
provider "kubernetes" {
  host                   = module.ray.cluster_endpoint
  cluster_ca_certificate = base64decode(module.ray.cluster_certificate_authority)
  exec {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", module.ray.cluster_name, "--region", var.region]
  }
}

provider "helm" {
  kubernetes = {
    host                   = module.ray.cluster_endpoint
    cluster_ca_certificate = base64decode(module.ray.cluster_certificate_authority)
    exec = {
      api_version = "client.authentication.k8s.io/v1beta1"
      command     = "aws"
      args        = ["eks", "get-token", "--cluster-name", module.ray.cluster_name, "--region", var.region]
    }
  }
}
