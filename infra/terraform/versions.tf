terraform {
  required_version = ">= 1.6"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.70"
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
