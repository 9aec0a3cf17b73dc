terraform {
  required_version = ">= 1.6"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 6.21" # 6.21: KMS Ed25519 keys (ECC_NIST_EDWARDS25519)
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
